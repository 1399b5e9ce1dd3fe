"""The GPU benchmarks' clock log (specpilot_mem.bench.cuda_timing): nvidia-smi's samples summarized per timing window.
nvidia-smi cannot run here, so a script on PATH prints what it prints; the parsing and summary are the real code."""

import os
import stat
import sys
import textwrap
import time

from specpilot_mem.bench.cuda_timing import ClockLog


# nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader,nounits
# -lms=100: one line a period; here 1980 MHz and no throttling until the test creates the file CAPPED, then the power
# cap (0x4) at 1485 MHz
FAKE_SMI = textwrap.dedent(f"""\
    #!{sys.executable}
    import os, time
    while True:
        now = time.time()
        capped = os.path.exists(os.path.join(os.path.dirname(__file__), "CAPPED"))
        print(time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now)) + ".%03d" % int(now % 1 * 1000),
              1485 if capped else 1980, "699.61" if capped else "412.20",
              "0x0000000000000004" if capped else "0x0000000000000000", sep=", ", flush=True)
        time.sleep(0.05)
    """)


def fake_smi(tmp_path, monkeypatch):
    script = tmp_path / "nvidia-smi"
    script.write_text(FAKE_SMI)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def window(clock, seconds):
    """A wall-clock window of ``seconds`` holding samples: it starts once the log has one (nvidia-smi started)."""
    deadline = time.time() + 30
    while not clock.samples() and time.time() < deadline:
        time.sleep(0.05)
    start = time.time()
    time.sleep(seconds)
    return start, time.time()


def test_windows_report_the_clock_and_the_power_cap(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch)
    with ClockLog(period_ms=50) as clock:
        cool = window(clock, 0.3)
        time.sleep(0.3)  # a window takes the sample one period past its end: it is still cool
        (tmp_path / "CAPPED").touch()
        time.sleep(0.3)  # the last cool sample is out
        capped = window(clock, 0.3)
        time.sleep(0.2)  # the windows' last samples are written
        assert clock.summaries({"cool": cool})["cool"]["sm_mhz"] == 1980  # read while nvidia-smi still writes
    summaries = clock.summaries({"cool": cool, "capped": capped, "before": (0, 1)})
    first, second = summaries["cool"], summaries["capped"]
    assert first["sm_mhz"] == 1980 and first["power_capped"] is False and first["power_w"] == 412.2
    assert second["sm_mhz"] == 1485 and second["sm_mhz_min"] == 1485 and second["power_capped"] is True
    assert second["power_w"] == 699.61 and second["samples"] >= 3
    assert summaries["before"] is None  # no samples in that window (read after the log closed: the same samples)


def test_without_nvidia_smi_nothing_is_recorded(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    with ClockLog() as clock:
        assert clock.samples() == [] and clock.summaries({"run": (0, time.time())}) == {"run": None}
