"""Power meters, the sampler thread and trapezoid energy.

The RAPL tests read real files: a fake powercap folder whose counters the test writes (read by an
unprivileged process where file modes matter: root reads any file). The sampler tests drive a small real meter whose power is a known function of time, so the
energy it should report is known in closed form.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from hetlab.errors import UserError
from hetlab.measure.power import (
    CommandMeter,
    MeterUnavailable,
    NvmlMeter,
    PowerMeter,
    PowerSampler,
    RaplMeter,
    available_meters,
    energy_per_sample,
    trapezoid_energy,
)

pytestmark = pytest.mark.serial  # a sampler thread's readings against wall time


class LinearMeter(PowerMeter):
    """A made-up device whose power rises linearly, P(t) = 10 W + 5 W/s · (t − start)."""

    method = "a linear function of time"
    slope = 5.0

    def __init__(self, name: str = "linear"):
        self.name = name
        self.start = time.perf_counter()
        self.calls: list[float] = []  # when each reading was taken

    def power(self, t: float) -> float:
        return 10.0 + self.slope * (t - self.start)

    def sample(self) -> float:
        self.calls.append(time.perf_counter())
        return self.power(self.calls[-1])

    def energy(self, t0: float, t1: float) -> float:
        return 10.0 * (t1 - t0) + self.slope / 2 * ((t1 - self.start) ** 2 - (t0 - self.start) ** 2)

    def tolerance(self, stamps, span: float) -> float:
        """How far the sampled energy may be from `energy()` because the sampler stamps a reading
        at the middle of the `sample()` call rather than at the instant the meter read the clock."""
        offset = max(abs(stamp - call) for stamp, call in zip(stamps, self.calls))
        return self.slope * offset * span + 1e-9


# trapezoid_energy


def test_trapezoid_is_exact_for_a_linear_curve_with_a_window_between_readings():
    times = np.array([0.0, 0.7, 1.5, 3.0, 4.1, 6.0, 8.0])
    watts = 3.0 + 2.0 * times
    t0, t1 = 0.3, 7.6
    assert trapezoid_energy(times, watts, t0, t1) == pytest.approx(3.0 * (t1 - t0) + (t1**2 - t0**2), rel=1e-12)
    assert trapezoid_energy(times, watts) == pytest.approx(3.0 * 8.0 + 8.0**2, rel=1e-12)


def test_trapezoid_matches_a_sine_curve_sampled_at_1hz_within_the_trapezoid_error_bound():
    a, b, omega, duration = 200.0, 50.0, 2 * math.pi / 60, 590.0  # not a whole number of periods
    times = np.arange(0.0, duration + 1.0, 1.0)
    watts = a + b * np.sin(omega * times)
    exact = a * duration + b / omega * (1 - math.cos(omega * duration))
    bound = duration * 1.0**2 / 12 * b * omega**2  # T·h²/12 · max|P''|: about 27 J of 118 kJ
    assert abs(trapezoid_energy(times, watts) - exact) <= bound


def test_trapezoid_rejects_a_window_outside_the_readings():
    with pytest.raises(ValueError, match="not within the readings"):
        trapezoid_energy([0.0, 1.0], [5.0, 5.0], 0.0, 2.0)


# PowerSampler


def test_sampler_thread_integrates_a_known_power_curve():
    meter = LinearMeter()
    entered = time.perf_counter()
    with PowerSampler([meter], interval=0.05) as sampler:
        time.sleep(0.5)
        stopping = time.perf_counter()
    left = time.perf_counter()

    times, _ = zip(*sampler.readings("linear"))
    assert entered <= times[0] and stopping <= times[-1] <= left  # the last reading is taken at stop
    assert len(times) >= 6  # about 11 at 20 Hz; fewer only if the machine starves the thread
    span = times[-1] - times[0]
    tolerance = meter.tolerance(times, span)
    assert sampler.energy_joules("linear") == pytest.approx(meter.energy(times[0], times[-1]), abs=tolerance)
    assert sampler.mean_watts("linear") == pytest.approx(meter.energy(times[0], times[-1]) / span, abs=tolerance / span)

    t0, t1 = times[0] + 0.12, times[-1] - 0.13
    assert sampler.energy_joules("linear", t0, t1) == pytest.approx(meter.energy(t0, t1), abs=tolerance)

    (row,) = sampler.report()
    assert (row.device, row.method, row.readings) == ("linear", meter.method, len(times))
    assert row.joules == pytest.approx(meter.energy(times[0], times[-1]), abs=tolerance)
    assert row.not_measured is None


def test_sampler_rejects_a_bad_interval_and_meters_with_the_same_name():
    with pytest.raises(UserError, match="interval"):
        PowerSampler([LinearMeter()], interval=0)
    with pytest.raises(UserError, match="distinct names"):
        PowerSampler([LinearMeter("gpu0"), LinearMeter("gpu0")])


def test_a_command_that_fails_mid_run_leaves_its_device_not_measured_and_training_unaffected(tmp_path):
    reading = tmp_path / "watts"
    reading.write_text("42.0\n")
    plug = CommandMeter(f"cat {reading}", r"([0-9.]+)", "wall plug")
    linear = LinearMeter()
    total = 0
    with pytest.warns(RuntimeWarning, match="wall plug is not measured"):
        with PowerSampler([plug, linear], interval=0.05, unavailable={"gpu0": "no driver"}) as sampler:
            for step in range(100):  # the "training" loop, which must neither see nor feel the failure
                total += step
                if step == 20:
                    reading.unlink()
                time.sleep(0.005)
            deadline = time.perf_counter() + 2.0
            while "wall plug" not in sampler.failed and time.perf_counter() < deadline:
                time.sleep(0.01)
    assert total == sum(range(100))

    rows = {row.device: row for row in sampler.report()}
    assert list(rows) == ["wall plug", "linear", "gpu0"]
    assert rows["wall plug"].joules is None and rows["wall plug"].readings >= 1  # its earlier readings don't count
    assert "failed with status 1" in rows["wall plug"].not_measured
    assert rows["wall plug"].describe().startswith("wall plug: not measured — power command `cat ")
    assert rows["gpu0"].describe() == "gpu0: not measured — no driver"
    assert rows["linear"].joules > 0 and rows["linear"].describe().startswith("linear: ")

    per_sample = energy_per_sample(list(rows.values()), processed=100)
    assert per_sample.per_device == {"linear": rows["linear"].joules / 100}
    assert per_sample.combined == rows["linear"].joules / 100
    assert per_sample.missing == ["wall plug", "gpu0"]
    assert per_sample.describe().endswith("J over linear; leaves out wall plug, gpu0 (not measured)")


# CommandMeter


def test_command_meter_reads_watts_from_a_real_command():
    meter = CommandMeter('echo "power: 12.5 W"', r"power: ([0-9.]+) W", "bench psu")
    assert meter.sample() == 12.5
    assert (meter.name, meter.method) == ("bench psu", 'command `echo "power: 12.5 W"`')


@pytest.mark.parametrize(
    ("command", "pattern", "message"),
    [
        ("echo oops >&2; exit 3", r"([0-9.]+)", "failed with status 3: oops"),
        ("echo 'power: N/A'", r"power: ([0-9.]+) W", "matches nothing in what"),
        ("echo 'power: N/A W'", r"power: (\S+) W", "which is not a number"),
        ("echo 12", r"[0-9]+", "needs a group around the number"),
        ("echo 12", r"([0-9]+", "is not a regular expression"),
    ],
)
def test_command_meter_says_what_is_wrong_before_training_starts(command, pattern, message):
    with pytest.raises(UserError, match=message):
        CommandMeter(command, pattern, "psu")


def test_command_meter_gives_up_on_a_command_that_hangs():
    with pytest.raises(MeterUnavailable, match="ran longer than 0.2 s"):
        CommandMeter("sleep 5", r"([0-9.]+)", "psu", timeout=0.2)


# RAPL on a fake powercap folder


MAX_ENERGY_UJ = 262_143_328_850  # a real package's max_energy_range_uj


def fake_package(powercap, package: int, energy_uj: int):
    zone = powercap / f"intel-rapl:{package}"
    zone.mkdir(parents=True)
    (zone / "name").write_text(f"package-{package}\n")
    (zone / "max_energy_range_uj").write_text(f"{MAX_ENERGY_UJ}\n")
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    return zone / "energy_uj"


def rapl_watts(counter, package, powercap, joules, start_uj):
    """Primes a RaplMeter, advances its counter by `joules`, and returns the reading with the
    bounds that the unknown instants of its two clock reads put on it."""
    before_prime = time.perf_counter()
    meter = RaplMeter(package, powercap)
    after_prime = time.perf_counter()
    time.sleep(0.05)
    counter.write_text(f"{(start_uj + int(joules * 1e6)) % MAX_ENERGY_UJ}\n")
    before_read = time.perf_counter()
    watts = meter.sample()
    after_read = time.perf_counter()
    return meter, watts, joules / (after_read - before_prime), joules / (before_read - after_prime)


def test_rapl_meter_turns_counter_increments_into_watts(tmp_path):
    counter = fake_package(tmp_path, 0, 5_000_000)
    meter, watts, low, high = rapl_watts(counter, 0, tmp_path, joules=3.0, start_uj=5_000_000)
    assert low <= watts <= high
    assert (meter.name, meter.method) == ("cpu package 0", "RAPL energy counter")


def test_rapl_meter_handles_the_counter_wrapping_around(tmp_path):
    start = MAX_ENERGY_UJ - 1_000_000  # 1 J before the wrap; the reading lands 2 J after it
    counter = fake_package(tmp_path, 0, start)
    _, watts, low, high = rapl_watts(counter, 0, tmp_path, joules=3.0, start_uj=start)
    assert int(counter.read_text()) == 2_000_000
    assert low <= watts <= high


def test_discovery_finds_every_fake_package_and_skips_sub_zones(tmp_path):
    fake_package(tmp_path, 0, 1)
    fake_package(tmp_path, 1, 1)
    (tmp_path / "intel-rapl:0:0").mkdir()  # the package's core sub-zone
    meters, _ = available_meters(tmp_path)
    assert [meter.name for meter in meters if isinstance(meter, RaplMeter)] == ["cpu package 0", "cpu package 1"]


def test_rapl_meter_says_when_the_counter_does_not_exist(tmp_path):
    with pytest.raises(MeterUnavailable, match="intel-rapl:0/energy_uj does not exist"):
        RaplMeter(0, tmp_path)
    _, unavailable = available_meters(tmp_path)
    assert "no RAPL zones" in unavailable["CPU packages"]


NOBODY = 65534  # the unprivileged user and group of Linux distributions


def unprivileged(function) -> str:
    """"ok", or "<exception type>: <message>" of what `function()` raised, run as a user without root's
    right to read any file: this process when it is not root, else a forked child that gives root up."""
    if os.geteuid() != 0:
        try:
            function()
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return "ok"
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(read)
            try:
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                function()
                outcome = "ok"
            except BaseException as e:
                outcome = f"{type(e).__name__}: {e}"
            os.write(write, outcome.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        outcome = pipe.read()
    os.waitpid(child, 0)
    return outcome


@pytest.fixture
def shared_tmp_path():
    """A temporary directory other users may enter (pytest's are the owner's only)."""
    with tempfile.TemporaryDirectory(prefix="hetlab-powercap-") as directory:
        os.chmod(directory, 0o755)
        yield Path(directory)


def test_rapl_meter_says_when_the_counter_is_root_only(shared_tmp_path):
    counter = fake_package(shared_tmp_path, 0, 1)
    counter.chmod(0o400)  # root's only, as Linux has made it since CVE-2020-8694 (Platypus)
    outcome = unprivileged(lambda: RaplMeter(0, shared_tmp_path))
    assert outcome == (f"MeterUnavailable: {counter} is readable by root only; run as root or "
                       f"`sudo chmod a+r {counter}`")


# NVML and this machine


def test_nvml_meter_says_how_to_install_nvidia_ml_py(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # what `import pynvml` meets where it is not installed
    with pytest.raises(MeterUnavailable, match="pip install nvidia-ml-py"):
        NvmlMeter(0)


def test_this_machine_either_measures_each_kind_of_device_or_says_why_not():
    meters, unavailable = available_meters()
    assert all(reason.strip() for reason in unavailable.values())
    for meter in meters:
        assert meter.sample() >= 0
    gpus = any(isinstance(m, NvmlMeter) for m in meters) or any(d.startswith(("gpu", "NVIDIA")) for d in unavailable)
    cpus = any(isinstance(m, RaplMeter) for m in meters) or any(d.startswith(("cpu", "CPU")) for d in unavailable)
    assert gpus and cpus
