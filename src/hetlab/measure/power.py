"""Power and energy per device: meters read watts, a sampler thread integrates them over a run.

A `PowerMeter` reads one device's power now, in watts. The meters here read NVIDIA GPUs
through NVML, CPU packages through Linux's RAPL energy counters, and anything else through a
shell command the user names (e.g. `rocm-smi`, a smart plug's CLI). `PowerSampler` reads every
meter on a background thread at a fixed interval, stamps each reading with
`time.perf_counter()` (the clock the timeline uses), and integrates (t, W) by the trapezoid
rule. A meter that cannot start, or that fails during the run, is reported as "not measured"
with its reason; it never stops training.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hetlab.errors import UserError

POWERCAP = Path("/sys/class/powercap")


class MeterUnavailable(UserError):
    """A meter cannot give a reading on this machine; the message says why and what to do."""


class PowerMeter(ABC):
    """Reads one device's power."""

    name: str  # the device, e.g. "gpu0 (NVIDIA H200)", "cpu package 0"
    method: str  # how it is measured, e.g. "NVML board power"

    @abstractmethod
    def sample(self) -> float:
        """The device's power now, in watts. Raises when the meter stops working."""


def _nvml():
    """The nvidia-ml-py module, initialised."""
    try:
        import pynvml
    except ImportError:
        raise MeterUnavailable("NVIDIA GPU power needs nvidia-ml-py: pip install nvidia-ml-py") from None
    try:
        pynvml.nvmlInit()  # reference-counted by NVML, so every meter may call it
    except pynvml.NVMLError as e:
        raise MeterUnavailable(f"NVML did not start ({e}); is the NVIDIA driver installed?") from None
    return pynvml


def _nvml_gpus() -> range:
    nvml = _nvml()
    try:
        return range(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError as e:
        raise MeterUnavailable(f"NVML cannot count the GPUs: {e}") from None


class NvmlMeter(PowerMeter):
    """Board power of NVIDIA GPU `index`, counted as NVML counts (all GPUs, whatever CUDA_VISIBLE_DEVICES says)."""

    method = "NVML board power"

    def __init__(self, index: int = 0):
        self._nvml = _nvml()
        try:
            self._handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
            model = self._nvml.nvmlDeviceGetName(self._handle)
            self._nvml.nvmlDeviceGetPowerUsage(self._handle)
        except self._nvml.NVMLError as e:
            raise MeterUnavailable(f"NVML cannot read the power of GPU {index}: {e}") from None
        model = model.decode() if isinstance(model, bytes) else model  # older nvidia-ml-py returns bytes
        self.name = f"gpu{index} ({model})"

    def sample(self) -> float:
        return self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0  # NVML reports milliwatts


class RaplMeter(PowerMeter):
    """Power of CPU package `package` from its RAPL energy counter (microjoules, wrapping around).

    A reading is the mean power since the previous reading; the constructor primes the counter.
    """

    method = "RAPL energy counter"

    def __init__(self, package: int = 0, powercap: Path | str = POWERCAP):
        zone = Path(powercap) / f"intel-rapl:{package}"
        self.name = f"cpu package {package}"
        self._counter = zone / "energy_uj"
        if not self._counter.exists():
            raise MeterUnavailable(
                f"no RAPL counter for CPU package {package}: {self._counter} does not exist "
                "(needs Linux's intel_rapl driver on an Intel or AMD CPU; most VMs have none)"
            )
        try:
            self._wrap = int((zone / "max_energy_range_uj").read_text())
            self._energy = self._read()
        except PermissionError:
            raise MeterUnavailable(
                f"{self._counter} is readable by root only; run as root or `sudo chmod a+r {self._counter}`"
            ) from None
        self._time = time.perf_counter()

    def _read(self) -> int:
        return int(self._counter.read_text())

    def sample(self) -> float:
        energy, now = self._read(), time.perf_counter()
        joules = ((energy - self._energy) % self._wrap) / 1e6  # the counter restarts at 0 after max_energy_range_uj
        watts = joules / (now - self._time)
        self._energy, self._time = energy, now
        return watts


class CommandMeter(PowerMeter):
    """Watts from a shell command's output: the first group of `pattern` is the number.

    The constructor runs the command once, so a command that fails or prints no match is
    reported before training starts.
    """

    def __init__(self, command: str, pattern: str, name: str, timeout: float = 5.0):
        self.command = command
        self.name = name
        self.method = f"command `{command}`"
        self.timeout = timeout
        try:
            self._pattern = re.compile(pattern)
        except re.error as e:
            raise UserError(f"power pattern {pattern!r} is not a regular expression: {e}") from None
        if self._pattern.groups < 1:
            raise UserError(f"power pattern {pattern!r} needs a group around the number, e.g. '([0-9.]+) W'")
        self.sample()

    def sample(self) -> float:
        try:
            done = subprocess.run(self.command, shell=True, capture_output=True, text=True, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise MeterUnavailable(
                f"power command `{self.command}` ran longer than {self.timeout:g} s; "
                "make it faster or raise its timeout"
            ) from None
        if done.returncode != 0:
            said = done.stderr.strip().splitlines()[-1:] or ["no message"]
            raise MeterUnavailable(f"power command `{self.command}` failed with status {done.returncode}: {said[0]}")
        match = self._pattern.search(done.stdout)
        if match is None:
            raise MeterUnavailable(
                f"power pattern {self._pattern.pattern!r} matches nothing in what `{self.command}` "
                f"printed: {done.stdout.strip()[:200]!r}; fix the pattern or the command"
            )
        try:
            return float(match.group(1))
        except ValueError:
            raise MeterUnavailable(
                f"power pattern {self._pattern.pattern!r} picked {match.group(1)!r} from `{self.command}`, "
                "which is not a number; its first group must hold only the watts"
            ) from None


def available_meters(powercap: Path | str = POWERCAP) -> tuple[list[PowerMeter], dict[str, str]]:
    """Every NVIDIA GPU and RAPL CPU package this machine can measure, and {device: reason} for the rest."""
    meters: list[PowerMeter] = []
    unavailable: dict[str, str] = {}
    try:
        gpus = _nvml_gpus()
    except MeterUnavailable as e:
        unavailable["NVIDIA GPUs"] = str(e)
        gpus = range(0)
    for index in gpus:
        try:
            meters.append(NvmlMeter(index))
        except MeterUnavailable as e:
            unavailable[f"gpu{index}"] = str(e)

    # Top-level zones "intel-rapl:N" are CPU packages; "intel-rapl:N:M" are their sub-zones.
    packages = sorted(int(zone.name.split(":")[1]) for zone in Path(powercap).glob("intel-rapl:*")
                      if zone.name.count(":") == 1)
    if not packages:
        unavailable["CPU packages"] = (
            f"no RAPL zones under {powercap} (needs Linux's intel_rapl driver on an Intel or AMD CPU; "
            "most VMs have none)"
        )
    for package in packages:
        try:
            meters.append(RaplMeter(package, powercap))
        except MeterUnavailable as e:
            unavailable[f"cpu package {package}"] = str(e)
    return meters, unavailable


def trapezoid_energy(times, watts, t0: float | None = None, t1: float | None = None) -> float:
    """Joules between t0 and t1 (default: the first and last reading) by the trapezoid rule.

    Power at t0 and t1 is interpolated linearly between the readings either side, so the
    window need not fall on readings, but it must lie within them.
    """
    times, watts = np.asarray(times, dtype=float), np.asarray(watts, dtype=float)
    if len(times) == 0 or len(times) != len(watts):
        raise ValueError(f"need as many power readings as times, at least one; got {len(watts)} and {len(times)}")
    t0 = times[0] if t0 is None else t0
    t1 = times[-1] if t1 is None else t1
    if not times[0] <= t0 <= t1 <= times[-1]:
        raise ValueError(f"window [{t0}, {t1}] is not within the readings [{times[0]}, {times[-1]}]")
    inside = (times > t0) & (times < t1)
    t = np.concatenate([[t0], times[inside], [t1]])
    w = np.concatenate([[np.interp(t0, times, watts)], watts[inside], [np.interp(t1, times, watts)]])
    return float(np.sum(np.diff(t) * (w[1:] + w[:-1]) / 2))


@dataclass(frozen=True)
class DeviceEnergy:
    """One device's row of the power report; `joules` is None when it was not measured."""

    device: str
    method: str | None
    readings: int
    mean_watts: float | None
    joules: float | None
    not_measured: str | None  # why, when joules is None

    def describe(self) -> str:
        if self.joules is None:
            return f"{self.device}: not measured — {self.not_measured}"
        return (f"{self.device}: {self.mean_watts:.1f} W mean, {self.joules:.1f} J "
                f"from {self.readings} readings ({self.method})")


@dataclass(frozen=True)
class EnergyPerSample:
    """Joules per processed training sample, per measured device and summed over them."""

    per_device: dict[str, float]
    combined: float | None  # over the measured devices only; None when none was measured
    missing: list[str]  # devices left out of `combined` because they were not measured

    def describe(self) -> str:
        if self.combined is None:
            return "energy per sample: not measured on any device"
        gap = f"; leaves out {', '.join(self.missing)} (not measured)" if self.missing else ""
        return f"energy per sample: {self.combined:.4g} J over {', '.join(self.per_device)}{gap}"


def energy_per_sample(report: Sequence[DeviceEnergy], processed: int) -> EnergyPerSample:
    if processed <= 0:
        raise ValueError(f"energy per sample needs a positive sample count, got {processed}")
    per_device = {row.device: row.joules / processed for row in report if row.joules is not None}
    missing = [row.device for row in report if row.joules is None]
    return EnergyPerSample(per_device, sum(per_device.values()) if per_device else None, missing)


class PowerSampler:
    """Reads every meter each `interval` seconds on a background thread, from `start()` to `stop()`.

    It reads once when started and once more when stopped, so the readings span the whole
    run. `unavailable` ({device: reason}, as from `available_meters`) joins the report as
    "not measured".
    """

    def __init__(self, meters: Sequence[PowerMeter], interval: float = 1.0,
                 unavailable: Mapping[str, str] | None = None):
        if interval <= 0:
            raise UserError(f"the power sampling interval must be > 0 s, got {interval}")
        names = [meter.name for meter in meters]
        if len(set(names)) != len(names):
            raise UserError(f"power meters need distinct names, got {names}")
        self.meters = list(meters)
        self.interval = interval
        self.unavailable = dict(unavailable or {})
        self.failed: dict[str, str] = {}  # meters that stopped working during the run, and why
        self._readings: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="power-sampler", daemon=True)

    def start(self) -> PowerSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> PowerSampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        tick = time.perf_counter()
        while True:
            self._read_all()
            tick = max(tick + self.interval, time.perf_counter())  # a slow round delays, never bunches, the next
            if self._stop.wait(tick - time.perf_counter()):
                self._read_all()
                return

    def _read_all(self) -> None:
        for meter in self.meters:
            if meter.name in self.failed:
                continue
            before = time.perf_counter()
            try:
                watts = meter.sample()
            except Exception as e:  # whatever breaks a meter, training goes on without it
                reason = str(e) if isinstance(e, MeterUnavailable) else f"{type(e).__name__}: {e}"
                with self._lock:
                    self.failed[meter.name] = reason
                warnings.warn(f"power of {meter.name} is not measured from now on: {reason}", RuntimeWarning)
                continue
            with self._lock:
                self._readings[meter.name].append(((before + time.perf_counter()) / 2, watts))

    def readings(self, device: str) -> list[tuple[float, float]]:
        """(perf_counter time, watts) of every reading of `device` so far."""
        with self._lock:
            return list(self._readings[device])

    def _measured(self, device: str) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """(times, watts) of `device`, or None when it is not measured: its meter failed, or it
        has fewer than two readings."""
        with self._lock:
            if device in self.failed or len(self._readings[device]) < 2:
                return None
            times, watts = zip(*self._readings[device])
        return times, watts

    def energy_joules(self, device: str, t0: float | None = None, t1: float | None = None) -> float | None:
        """Joules `device` used between t0 and t1 (perf_counter times; default: all its readings),
        or None when it is not measured."""
        measured = self._measured(device)
        return None if measured is None else trapezoid_energy(*measured, t0, t1)

    def mean_watts(self, device: str, t0: float | None = None, t1: float | None = None) -> float | None:
        """Mean power of `device` between t0 < t1 (default: all its readings), or None when it is not measured."""
        measured = self._measured(device)
        if measured is None:
            return None
        times, watts = measured
        t0 = times[0] if t0 is None else t0
        t1 = times[-1] if t1 is None else t1
        return trapezoid_energy(times, watts, t0, t1) / (t1 - t0)

    def report(self) -> list[DeviceEnergy]:
        """One row per device over all its readings: method, readings, mean W, J, or why not measured."""
        rows = []
        for meter in self.meters:
            measured = self._measured(meter.name)
            if measured is None:
                readings = len(self.readings(meter.name))
                reason = self.failed.get(meter.name, f"{readings} reading(s); start, then stop the sampler")
                rows.append(DeviceEnergy(meter.name, meter.method, readings, None, None, reason))
                continue
            times, watts = measured
            joules = trapezoid_energy(times, watts)
            mean_watts = joules / (times[-1] - times[0])
            rows.append(DeviceEnergy(meter.name, meter.method, len(times), mean_watts, joules, None))
        rows += [DeviceEnergy(device, None, 0, None, None, why) for device, why in self.unavailable.items()]
        return rows
