"""W12 codec: every BF16 bit pattern round-trips, the view is FP8-readable, the on-disk form is stable."""

from pathlib import Path

import pytest
import torch

from benchmarks.w12_checkpoint_stats import checkpoint_stats
from specpilot_kernels.w12 import (
    FORMAT_VERSION,
    W12Error,
    check_roundtrip,
    decode,
    encode,
    fp8_view,
    from_canonical,
    to_canonical,
)
from specpilot_kernels.w12.format import (
    MAX_BASE,
    RECORD_BYTES,
    RECORD_HEADER_BYTES,
    W12Tensor,
    choose_base_code,
    escape_positions,
    record_sections,
    to_tile_records,
)
from specpilot_kernels.w12.codec import encode_or_keep
from specpilot_kernels.w12.convert import convert_tensors, load_converted
from specpilot_kernels.w12.reference import _in_window, choose_base, qpass_weight_reference


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def all_patterns() -> torch.Tensor:
    return torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


@pytest.mark.parametrize("shape", [(256, 256), (512, 128), (128, 512), (1, 65536)])
def test_every_bf16_pattern_roundtrips(shape):
    w = all_patterns().view(*shape)
    w12 = encode(w)  # encode() itself checks bit for bit
    assert torch.equal(bits(decode(w12)), bits(w))


def test_specials_roundtrip_inside_ordinary_weights():
    torch.manual_seed(0)
    w = (torch.randn(300, 700) * 0.02).bfloat16()
    specials = {
        (0, 0): 0x0000,
        (0, 1): 0x8000,  # +-0
        (1, 2): 0x0001,
        (1, 3): 0x807F,
        (2, 4): 0x0040,  # denormals
        (3, 5): 0x7F80,
        (3, 6): 0xFF80,  # +-Inf
        (4, 7): 0x7FC0,
        (4, 8): 0x7F81,
        (5, 9): 0xFFFF,
        (6, 10): 0x7FA5,  # NaNs with payloads
        (7, 11): 0x7F7F,
        (8, 12): 0x0080,  # largest and smallest normals
    }
    raw = bits(w).clone()
    for (r, c), pattern in specials.items():
        raw[r, c] = torch.tensor(pattern, dtype=torch.int32).to(torch.int16)
    w = raw.view(torch.bfloat16)
    w12 = encode(w)
    assert torch.equal(bits(decode(w12)), raw)
    assert w12.num_escapes >= len(specials)


@pytest.mark.parametrize("scale", [1e-30, 1e-3, 1.0, 1e30])
def test_odd_shapes_and_scales(scale):
    torch.manual_seed(1)
    w = (torch.randn(130, 77) * scale).bfloat16()
    w12 = encode(w)
    assert w12.padded_shape == (256, 128)
    assert torch.equal(bits(decode(w12)), bits(w))
    assert w12.stats()["escape_fraction"] < 1e-2


def test_window_moves_up_when_the_top_binade_would_hit_the_nan_code():
    # Row 0: many weights 1.875..1.99 (exponent E, mantissa 111: the excluded E4M3 NaN code at offset 15);
    # shifting the window up by one binade costs only the one tiny weight.
    row = torch.full((1, 256), 1.9).bfloat16()
    row[0, 0] = 2.0**-14
    base = choose_base(bits(row))
    exponent_of_1_9 = 127
    assert int(base[0]) == exponent_of_1_9 + 1 - 15
    w12 = encode(row)
    assert w12.num_escapes == 1


def test_eight_bit_view_reads_as_fp8_times_row_scale():
    torch.manual_seed(2)
    w = (torch.randn(256, 256) * 0.05).bfloat16()
    w[3, 3] = 0.0
    w12 = encode(w)
    fp8, scale = fp8_view(w12)
    assert fp8.data_ptr() == w12.view.data_ptr()  # no copy
    values = fp8.float()
    assert not torch.isnan(values).any()
    codes = w12.view[:256, :256].to(torch.int32)
    offsets = (codes >> 3) & 0xF
    assert bool(((offsets > 0) | ((codes & 0x7F) == 0)).all())  # no E4M3 subnormal codes, only +-0 escapes
    truncated = qpass_weight_reference(w12, "truncated").float()
    assert torch.equal(values * scale[:, None], truncated)
    midpoint = qpass_weight_reference(w12, "midpoint").float()
    exact = w.float()
    stored = torch.ones_like(exact, dtype=torch.bool)
    rows, cols = escape_positions(w12)
    stored[rows, cols] = False
    # dropped bits span [0, 16/128) of the leading binade: midpoint error <= 1/16, truncation error < 1/8
    assert ((midpoint - exact).abs()[stored] <= exact.abs()[stored] / 16).all()
    assert ((truncated - exact).abs()[stored] < exact.abs()[stored] / 8).all()
    assert (midpoint - exact).abs().mean() < (truncated - exact).abs().mean()


def test_version_2_tile_records_roundtrip_and_are_12kb_per_tile():
    torch.manual_seed(3)
    w = (torch.randn(200, 300) * 0.02).bfloat16()
    w[10, 20] = 0
    w12 = encode(w)
    disk = to_tile_records(w12)
    assert disk["records"].shape == (
        2 * 6,
        RECORD_BYTES,
    )  # 200 -> 256 rows, 300 -> 384 columns and RECORD_BYTES == 12288
    assert int(disk["header"][0]) == 2  # version 3 keeps version 2's window; only its stored record differs
    # the first record's first 8 KB is tile (0, 0) of the 8-bit view, row-major
    assert torch.equal(disk["records"][0, :8192].view(128, 64), w12.view[:128, :64])
    back = from_canonical(disk)
    for name in ("view", "nibbles", "base", "esc_ptr", "esc_loc", "esc_val"):
        assert torch.equal(getattr(back, name), getattr(w12, name)), name
    assert torch.equal(bits(decode(back)), bits(w))


def test_tile_records_reject_bad_input_with_what_where_and_fix_without_changing_input():
    w = (torch.randn(200, 300) * 0.02).bfloat16()
    w[3, 4] = 0
    w[150, 299] = 1e-39
    disk = to_tile_records(encode(w))
    saved = {key: value.clone() for key, value in disk.items()}

    def refused(match, **changes):
        with pytest.raises(W12Error, match=match) as err:
            from_canonical({**disk, **changes}, name="layers.0.q_proj")
        assert err.value.where.startswith("layers.0.q_proj") and err.value.fix
        return err.value

    header = disk["header"].clone()
    header[0] = FORMAT_VERSION + 1
    assert "specpilot_kernels.w12.convert" in refused("format version", header=header).fix
    header[0] = 3  # version 3 is one byte record, never tile records
    assert ".record" in str(refused("format version 3", header=header))
    refused("records have shape", records=disk["records"][:-1])
    refused("base has", base=disk["base"][:-1])
    refused("not torch.int16", escape_bits=disk["escape_bits"].to(torch.int32))
    refused("escape positions and", escape_bits=disk["escape_bits"][:-1])
    outside = disk["escapes"].clone()
    outside[-1, 1] = 300  # column K: inside the padding, outside the tensor
    assert refused("outside", escapes=outside).where == f"layers.0.q_proj.escapes[{outside.shape[0] - 1}]"
    repeated = disk["escapes"].clone()
    repeated[1] = repeated[0]
    refused("strictly increasing", escapes=repeated)
    base = disk["base"].clone()
    base[0] = 240
    refused("above 239", base=base)
    with pytest.raises(W12Error, match="missing"):
        from_canonical({k: v for k, v in disk.items() if k != "base"})
    for key, value in saved.items():  # nothing was changed in place
        assert torch.equal(disk[key], value)


def test_version_1_records_still_decode():
    torch.manual_seed(7)
    w = (torch.randn(256, 512) * 0.02).bfloat16()
    w[0, 0] = 40.0  # an outlier: the v1 window sits higher than v2's
    v1 = encode(w, version=1)
    disk = to_tile_records(v1)
    assert int(disk["header"][0]) == 1
    back = from_canonical(disk)
    assert back.version == 1 and torch.equal(bits(decode(back)), bits(w))
    assert encode(w).num_escapes < v1.num_escapes
    v3 = from_canonical(to_canonical(v1))  # a v1 window stores in a v3 record as it is
    assert v3.version == 3 and torch.equal(v3.base, v1.base) and torch.equal(bits(decode(v3)), bits(w))


def test_check_roundtrip_names_the_first_differing_weight():
    torch.manual_seed(4)
    w = (torch.randn(128, 256) * 0.02).bfloat16()
    w12 = encode(w)
    corrupt = W12Tensor(w12.shape, w12.view, w12.nibbles.clone(), w12.base, w12.esc_ptr, w12.esc_loc, w12.esc_val)
    corrupt.nibbles[5, 9] ^= 0x01
    with pytest.raises(W12Error) as err:
        check_roundtrip(w, corrupt, name="layers.0.q_proj")
    assert err.value.where == "layers.0.q_proj[5, 9]" and err.value.fix
    assert check_roundtrip(w, w12)["escapes"] == w12.num_escapes


def test_checkpoint_stats_cover_every_matrix(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(6)
    path = tmp_path / "tiny.safetensors"
    save_file(
        {
            "a.weight": (torch.randn(64, 96) * 0.02).bfloat16(),
            "b.weight": torch.randn(32, 128) * 0.1,
            "norm.weight": torch.ones(64),
        },
        str(path),
    )
    stats = checkpoint_stats(str(path))
    assert set(stats["tensors"]) == {"a.weight", "b.weight"}  # 1-D tensors are not linear weights
    assert stats["tensors"]["b.weight"]["source_dtype"] == "float32"
    assert stats["weights"] == 64 * 96 + 32 * 128


def test_stats_count_every_byte():
    w12 = encode((torch.randn(256, 1024) * 0.02).bfloat16())
    s = w12.stats()
    planes = 256 * 1024 * 1.5
    assert s["bytes"] == to_canonical(w12)["record"].numel() == sum(s["record_bytes"].values()) > planes
    assert s["memory_bytes"] == w12.nbytes() > s["bytes"]
    assert 12.0 < s["bits_per_weight"] < s["memory_bits_per_weight"] < 12.2


def test_encode_rejects_what_is_not_a_2d_bf16_tensor():
    for bad in (torch.randn(4, 4), torch.randn(8).bfloat16(), torch.randn(2, 3, 4).bfloat16(), [[1.0]]):
        with pytest.raises(W12Error, match="2-D bfloat16") as err:
            encode(bad)
        assert err.value.where == "encode(weight)" and "out_features" in err.value.fix


def brute_force_counts(row_bits: torch.Tensor) -> torch.Tensor:
    sign_exp_man = row_bits.to(torch.int32) & 0xFFFF
    exp, man = (sign_exp_man >> 7) & 0xFF, sign_exp_man & 0x7F
    return torch.tensor([int(_in_window(exp, man, torch.tensor(b)).sum()) for b in range(240)])


def test_v2_window_covers_the_most_weights_ties_to_the_lowest_base():
    torch.manual_seed(8)
    rows = torch.cat(
        [
            (torch.randn(3, 512) * torch.logspace(-30, 30, 512))
            .bfloat16()
            .view(torch.int16),  # exponents over 200 binades
            (torch.randn(2, 512) * 0.02).bfloat16().view(torch.int16),
            torch.zeros(1, 512, dtype=torch.int16),  # no normal weight: base 0
        ]
    )
    rows[3, :5] = torch.tensor([300.0, -1e4, 2e5, 1e-30, 0.0]).bfloat16().view(torch.int16)  # outliers in a row
    bases = choose_base(rows)
    for r in range(rows.shape[0]):
        counts = brute_force_counts(rows[r])
        best = int(counts.max())
        assert int(counts[int(bases[r])]) == best
        assert int(bases[r]) == int(torch.nonzero(counts == best)[0, 0])  # the lowest base among the best
    assert int(bases[-1]) == 0
    # one large outlier no longer pushes the window up: only the outliers escape
    clean = (torch.randn(64, 1024) * 0.02).bfloat16()
    w = clean.clone()
    w[::2, 7] = 500.0
    assert encode(w).num_escapes <= encode(clean).num_escapes + 32 < encode(w, version=1).num_escapes / 100


def test_tensors_are_kept_bf16_where_w12_does_not_pay():
    torch.manual_seed(9)
    good = (torch.randn(256, 512) * 0.02).bfloat16()
    w12, report = encode_or_keep(good, name="q_proj")
    assert w12 is not None and not report["kept_bf16"] and report["bits_per_weight"] < 12.1
    sparse = good.clone()
    sparse[:, ::4] = 0.0  # a quarter of the weights are zeros: escapes
    w12, report = encode_or_keep(sparse, name="pruned")
    assert (
        w12 is None
        and report["kept_bf16"]
        and "bits a weight in memory" in report["reason"]
        and report["memory_bits_per_weight"] > 14.4
    )
    some = good.clone()
    some[:, ::32] = 0.0  # 3% zeros: small enough in bytes, too many escapes for the GEMM's budget
    w12, report = encode_or_keep(some, name="pruned")
    assert w12 is None and "escape the window" in report["reason"] and report["memory_bits_per_weight"] < 14.4


def test_converted_checkpoint_roundtrips_and_reports_every_candidate():
    torch.manual_seed(10)
    pruned = (torch.randn(128, 256) * 0.02).bfloat16()
    pruned[:, ::2] = 0.0
    tensors = {
        "a.weight": (torch.randn(250, 256) * 0.02).bfloat16(),
        "narrow.weight": (torch.randn(256, 64) * 0.02).bfloat16(),  # K = 64 pads to 128 in memory, not on disk
        "pruned.weight": pruned,
        "norm.weight": torch.ones(300).bfloat16(),
        "f32.weight": torch.randn(8, 8),
    }
    stored, reports = convert_tensors(tensors)
    assert [r["name"] for r in reports] == ["a.weight", "narrow.weight", "pruned.weight"]
    narrow = reports[1]
    assert not narrow["kept_bf16"] and narrow["bits_per_weight"] < 12.1 and narrow["loads_as_bf16"]
    assert "in memory" in narrow["load_reason"] and narrow["memory_bits_per_weight"] > 14.4
    assert reports[2]["kept_bf16"] and "record needs" in reports[2]["reason"]
    assert "a.weight" not in stored and "a.weight.w12.record" in stored and stored["pruned.weight"] is pruned
    back = load_converted(stored)
    assert torch.equal(bits(decode(back["a.weight"])), bits(tensors["a.weight"]))
    assert back["pruned.weight"] is pruned and back["f32.weight"] is tensors["f32.weight"]
    assert torch.equal(bits(back["narrow.weight"]), bits(tensors["narrow.weight"]))  # decoded to BF16 at load
    # a file written before version 3 (tile records) still loads; one with a field missing is refused naming it
    old = {f"a.weight.w12.{field}": value for field, value in to_tile_records(encode(tensors["a.weight"])).items()}
    assert torch.equal(bits(decode(load_converted(old)["a.weight"])), bits(tensors["a.weight"]))
    del old["a.weight.w12.base"]
    with pytest.raises(W12Error, match="lacks base"):
        load_converted(old)


@pytest.mark.gpu
def test_gpu_encode_equals_cpu_encode():
    torch.manual_seed(5)
    w = (torch.randn(1000, 3000) * 0.02).bfloat16()
    cpu = encode(w)
    gpu = encode(w.cuda())
    assert torch.equal(to_canonical(gpu)["record"].cpu(), to_canonical(cpu)["record"])
    assert torch.equal(bits(decode(from_canonical(to_canonical(gpu)))).cpu(), bits(w))
    gpu = gpu.to("cpu")
    for name in ("view", "nibbles", "base", "esc_ptr", "esc_loc", "esc_val"):
        assert torch.equal(getattr(cpu, name), getattr(gpu, name)), name


TRAINED = [
    Path(__file__).resolve().parents[1] / "models" / name for name in ("target.safetensors", "drafter.safetensors")
]


@pytest.mark.parametrize("path", TRAINED, ids=lambda p: p.name)
def test_trained_network_weights_roundtrip(path):
    # The only trained networks available offline are the engine's pair in models/ (no pip package here
    # ships trained weights); every 2-D tensor must decode bit for bit (encode() checks it).
    stats = checkpoint_stats(str(path))
    assert stats["tensors"]
    # The stored record (version 3) pads nothing: every tensor of at least 256 x 64 that stores as W12 costs about 12
    # bits per weight, headers, bases and escapes included (smaller ones pay the 32-byte header, a conv kernel's 4
    # weights a row pay its base), none stored as W12 costs more than 14.4 and none anything above BF16's 16
    # (checkpoint_stats also reads every record back and decodes it bit for bit).
    w12 = {name: t for name, t in stats["tensors"].items() if not t["kept_bf16"]}
    large = {name: t for name, t in w12.items() if t["shape"][0] >= 256 and t["shape"][1] >= 64}
    assert large and all(t["bits_per_weight"] < 12.05 for t in large.values()), large
    assert all(t["bits_per_weight"] <= 14.4 for t in w12.values())
    assert all(t["stored_bits_per_weight"] <= 16.0 for t in stats["tensors"].values())


def test_codec_imports_without_triton():
    # the codec, the CUDA kernels' host code and the CPU path need no Triton: its GEMM is imported on first use
    import subprocess
    import sys

    code = "import sys, specpilot_kernels.w12; sys.exit('specpilot_kernels.w12.gemm' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def outlier_weights(n: int, k: int, fraction: float, seed: int) -> tuple[torch.Tensor, int]:
    """Weights whose bulk fits one window (magnitudes in [2**-7, 2**-5)) with exactly round(fraction * n * k)
    outliers that must escape: zeros, tiny values, huge values and Inf/NaN."""
    gen = torch.Generator().manual_seed(seed)
    sign = torch.where(torch.rand(n, k, generator=gen) < 0.5, -1.0, 1.0)
    w = (sign * torch.rand(n, k, generator=gen) * 2**-6 + sign * 2**-7).bfloat16()
    count = round(fraction * n * k)
    where = torch.randperm(n * k, generator=gen)[:count]
    pool = torch.tensor([0.0, -0.0, 1e-30, -3e-20, 5e3, -7e12, float("inf"), float("nan")]).bfloat16()
    w.view(-1)[where] = pool[torch.arange(count) % pool.numel()]
    return w, count


@pytest.mark.parametrize("fraction", [0.0, 1e-4, 1e-3, 1e-2])
@pytest.mark.parametrize("shape", [(300, 200), (257, 129), (1, 5), (64, 1024)])
def test_version_3_record_roundtrips_bit_exact_at_every_escape_fraction(fraction, shape):
    w, count = outlier_weights(*shape, fraction, seed=shape[0] + shape[1])
    w12 = encode(w)
    assert w12.num_escapes == count
    record = to_canonical(w12)["record"]
    assert record.dtype == torch.uint8 and record.numel() == w12.stored_nbytes()
    back = from_canonical({"record": record}, name="layers.0.q_proj")
    for field in ("view", "nibbles", "base", "esc_ptr", "esc_loc", "esc_val"):
        assert torch.equal(getattr(back, field), getattr(w12, field)), field
    assert back.version == FORMAT_VERSION == 3 and torch.equal(bits(decode(back)), bits(w))


def test_version_3_record_is_unpadded_with_compact_bases_and_escapes():
    torch.manual_seed(11)
    w = (torch.randn(384, 384) * 0.02).bfloat16()
    w12 = encode(w)
    sections = record_sections(w12)
    assert sections["header"] == RECORD_HEADER_BYTES
    assert sections["view"] == 384 * 384 and sections["nibbles"] == 384 * 192  # no padding rows or columns
    assert sections["base"] + sections["base_exceptions"] <= 384 // 2  # at most 4 bits a row, a byte a row before
    assert sections["escape_bits"] == 2 * w12.num_escapes and sections["escape_gaps"] <= 2 * w12.num_escapes
    assert w12.stats()["bits_per_weight"] < 12.02 < w12.stats()["memory_bits_per_weight"]


def base_stream_bytes(base: torch.Tensor, base0: int, width: int) -> float:
    if width == 0:
        return 0 if bool((base == base0).all()) else float("inf")
    delta = base.long() - base0
    return -(-base.numel() * width // 8) + int(((delta < 0) | (delta >= (1 << width) - 1)).sum())


def test_base_stream_is_the_smallest_width_and_offset():
    gen = torch.Generator().manual_seed(12)
    cases = [
        torch.full((100,), 117, dtype=torch.uint8),  # one window everywhere: nothing stored
        torch.randint(110, 113, (1000,), generator=gen).to(torch.uint8),  # three bases: 2 bits a row
        torch.cat([torch.randint(110, 112, (1000,), generator=gen), torch.tensor([0, MAX_BASE])]).to(torch.uint8),
        torch.randint(0, MAX_BASE + 1, (50,), generator=gen).to(torch.uint8),
    ]
    for base in cases:
        base0, width = choose_base_code(base)
        best = min(base_stream_bytes(base, b0, w) for w in range(9) for b0 in range(MAX_BASE + 1))
        assert base_stream_bytes(base, base0, width) == best
    assert choose_base_code(cases[0]) == (117, 0) and choose_base_code(cases[1]) == (110, 2)
    assert choose_base_code(cases[2]) == (109, 2)  # 2 bits (one code marks exceptions); ties: the lowest base0


def test_version_3_record_refuses_bad_input_with_what_where_and_fix_without_changing_input():
    w, _ = outlier_weights(200, 300, 1e-3, seed=13)
    w[7] = torch.linspace(-1e3, 1e3, 300).bfloat16()  # a row whose window lies elsewhere: a base exception
    w12 = encode(w)
    record = to_canonical(w12)["record"]
    saved = record.clone()
    sections = record_sections(w12)
    offset = dict(zip(sections, torch.cumsum(torch.tensor([0, *sections.values()]), 0).tolist()))
    assert sections["base_exceptions"] >= 1

    def refused(match, data):
        with pytest.raises(W12Error, match=match) as err:
            from_canonical({"record": data}, name="layers.0.q_proj")
        assert err.value.where.startswith("layers.0.q_proj.record") and "specpilot_kernels.w12.convert" in err.value.fix
        return err.value

    def changed(at, value):
        data = record.clone()
        data[at] = value
        return data

    def header_word(i, value):
        data = record.clone()
        data[4 * i : 4 * i + 4] = torch.tensor([value], dtype=torch.int32).view(torch.uint8)
        return data

    refused("format version 4", header_word(1, 4))
    assert "tile records" in str(refused("format version 2", header_word(1, 2)))
    refused("magic", header_word(0, 0))
    refused("not a 1-D record", record[:10])
    refused("planes, .* need", record[:-1])  # wrong plane sizes: the record is shorter than its header says
    refused("planes, .* need", header_word(3, 301))
    base_byte = offset["base"]
    refused("marks .* rows as exceptions", changed(base_byte, int(record[base_byte]) ^ 0xFF))
    refused("above 239", changed(offset["base_exceptions"], 250))
    last_gap = offset["escape_gaps"] + sections["escape_gaps"] - 1
    refused("outside the 60000-weight tensor|past the", changed(last_gap, 0x7F))
    refused("ends inside one", changed(last_gap, int(record[last_gap]) | 0x80))
    first_gap = offset["escape_gaps"]
    refused("stored weight|does not name", changed(first_gap, int(record[first_gap]) ^ 0x01))
    assert torch.equal(record, saved)  # nothing was changed in place
    with pytest.raises(W12Error, match="not torch.uint8"):
        from_canonical({"record": record.to(torch.int16)})
