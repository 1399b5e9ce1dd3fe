"""Registers and the SASS instructions a warp executes per main-loop iteration of every W12 mma kernel
(the kernel files in csrc/ built by nvcc; the rarely taken escape-patch branch skipped), the instruction counts the notes
quote. Needs nvcc and cuobjdump (CUDA 12.8+), no GPU.

    python benchmarks/w12_sass.py [--arch sm_90a] [--out FILE.json]

The compiler may unroll a loop iteration over several chunks: a chunk is 8 MMAs per token tile and tile a warp,
so `instructions_per_chunk` divides by the iteration's MMAs. The `kernel` key is the template's
<token tiles, low bits, blocks a step, tiles a warp, weights staged in shared memory, K splits in a cluster>; the
shared-activation kernel's, `shared_x <token tiles, low bits, blocks a step, K splits in a cluster>`; the warpgroup
kernel's (sm_90a; 8 wgmma a chunk, each for 4 tiles), `wgmma <token tiles, low bits, K splits in a cluster,
weights staged in shared memory>`.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot_mem.provenance import print_result, result_header  # noqa: E402

CSRC = Path(__file__).resolve().parents[1] / "kernels" / "specpilot_kernels" / "w12" / "csrc"
SHARED_HEADERS = CSRC.parents[1] / "csrc"  # the library's shared headers (pdl.cuh, ptx.cuh)
KERNEL_FILES = ("w12_warp.cu", "w12_shared_x.cu", "w12_wgmma.cu")  # the kernel families the counts cover
KERNEL = re.compile(r"w12_mma_kernelILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELb([01])ELb([01])E")
# the shared-activation kernel (17-32 rows, one tile a warp): <token tiles, low bits, blocks a step, K splits in a cluster>
SHARED_X_KERNEL = re.compile(r"w12_shared_x_kernelILi(\d+)ELi(\d+)ELi(\d+)ELb([01])E")
WGMMA_KERNEL = re.compile(r"w12_wgmma_kernelILi(\d+)ELi(\d+)ELb([01])ELb([01])E")
MMA_OPCODES = ("HMMA", "HGMMA")  # mma.sync, wgmma
ADDRESS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)")
BRANCH = re.compile(r"BRA (0x[0-9a-f]+)")


def loop_instructions(sass: str) -> list[str]:
    """Opcodes of one pass through a kernel's main loop: from the target of the first backward branch after the
    last MMA that jumps back over it to that branch (forward branches in between, such as a shared-activation
    round's release, are part of the pass), skipping each escape check's taken branch (VOTE.ANY, then the branch
    over the patch loop, which runs only when a step holds an escape)."""
    lines = [(int(m.group(1), 16), m.group(3), line) for line in sass.splitlines() if (m := ADDRESS.search(line))]
    last_mma = max(i for i, (_, op, _) in enumerate(lines) if op.startswith(MMA_OPCODES))
    back = next(
        i
        for i in range(last_mma, len(lines))
        if (b := BRANCH.search(lines[i][2])) and int(b.group(1), 16) <= lines[last_mma][0]
    )
    start_address = int(BRANCH.search(lines[back][2]).group(1), 16)
    start = next(i for i, (address, _, _) in enumerate(lines) if address == start_address)
    ops, i = [], start
    while i <= back:
        ops.append(lines[i][1])
        if lines[i][1].startswith("VOTE.ANY"):
            branch = next(k for k in range(i + 1, i + 4) if BRANCH.search(lines[k][2]))
            ops += [op for _, op, _ in lines[i + 1 : branch + 1]]
            skip_to = int(BRANCH.search(lines[branch][2]).group(1), 16)
            i = branch + 1
            while i <= back and lines[i][0] < skip_to:
                i += 1
            continue
        i += 1
    return ops


def tool(name: str) -> str:
    """A CUDA tool: on PATH, beside nvcc, or (cuobjdump) the copy Triton ships."""
    places = [shutil.which(name)]
    if shutil.which("nvcc"):
        places.append(Path(shutil.which("nvcc")).resolve().with_name(name))
    try:
        import triton

        places.append(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)
    except ImportError:
        pass
    for place in places:
        if place and Path(place).exists():
            return str(place)
    sys.exit(
        f"error: {name} not found on PATH or beside nvcc; install the CUDA toolkit (12.8+) or put its bin/ on PATH"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="sm_90a", help="nvcc -arch (sm_90a: the H200; sm_120: RTX PRO 6000)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here as well as to stdout")
    args = parser.parse_args(argv)
    stderr, sass = "", ""
    with tempfile.TemporaryDirectory() as tmp:
        for source in KERNEL_FILES:
            cubin = Path(tmp) / f"{source}.cubin"
            build = subprocess.run(
                [
                    tool("nvcc"),
                    f"-arch={args.arch}",
                    "-std=c++17",
                    "-O3",
                    "-cubin",
                    "-Xptxas",
                    "-v",
                    f"-I{SHARED_HEADERS}",
                    f"-I{CSRC}",
                    str(CSRC / source),
                    "-o",
                    str(cubin),
                ],
                capture_output=True,
                text=True,
            )
            if build.returncode:
                sys.exit(f"error: nvcc failed on {source}:\n{build.stderr[-2000:]}")
            stderr += build.stderr
            sass += subprocess.run(
                [tool("cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True, check=True
            ).stdout
    registers = {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", stderr, re.S)
    }
    kernels = []
    for function in re.split(r"\n\s*Function : ", sass)[1:]:
        name = function.split("\n", 1)[0].strip()
        match = KERNEL.search(name)
        shared = SHARED_X_KERNEL.search(name)
        warpgroup = WGMMA_KERNEL.search(name)
        if not (match or shared or warpgroup):
            continue
        ops = loop_instructions(function)
        if match:
            token_tiles, _, _, tiles_per_warp, _, _ = map(int, match.groups())
            mmas_per_chunk = 8 * token_tiles * tiles_per_warp
            key = "<{}>".format(", ".join(match.groups()))
        elif shared:
            mmas_per_chunk = 8 * int(shared.group(1))
            key = "shared_x <{}>".format(", ".join(shared.groups()))
        else:
            mmas_per_chunk = 8  # one wgmma a k16 step covers every token tile
            key = "wgmma <{}>".format(", ".join(warpgroup.groups()))
        chunks = sum(op.startswith(MMA_OPCODES) for op in ops) / mmas_per_chunk
        kernels.append(
            {
                "kernel": key,
                "registers": registers.get(name),
                "loop_instructions": len(ops),
                "chunks_per_iteration": chunks,
                "instructions_per_chunk": round(len(ops) / chunks, 1),
                "by_opcode": dict(Counter(op.split(".")[0] for op in ops).most_common()),
            }
        )
    kernels.sort(
        key=lambda k: (
            k["kernel"].split(" <")[0] if " <" in k["kernel"] else "",
            tuple(int(v) for v in k["kernel"].split("<")[1].strip(">").split(", ")),
        )
    )
    nvcc_version = (
        subprocess.run([tool("nvcc"), "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    )
    command = [__file__, *(argv if argv is not None else sys.argv[1:])]
    doc = {
        **result_header("w12_sass", command),
        "arch": args.arch,
        "nvcc": nvcc_version[-1] if nvcc_version else None,
        "kernels": kernels,
    }
    print_result(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
