"""``commgnn cluster``: the shape of an emulated multi-host cluster on one Linux machine.

Units follow ``tc``: rates as ``100mbit``, ``1gbit``, ``25gbit``, ``500kbit`` (bits per
second, SI prefixes), times as ``5ms``, ``200us``, ``1s``, loss as ``0.1%``.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any

from commgnn.errors import ConfigError
from commgnn.options import OptionSet, opt

_RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def parse_rate(text: str) -> float:
    """``'100mbit'`` -> 1e8 bits per second."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]+)\s*", str(text))
    if not m or m.group(2).lower() not in _RATE_UNITS:
        raise ConfigError(f"a rate is a number and one of {', '.join(_RATE_UNITS)} (e.g. 100mbit), got {text!r}")
    value = float(m.group(1)) * _RATE_UNITS[m.group(2).lower()]
    if value < 8e3:
        raise ConfigError(f"a rate must be at least 8kbit, got {text!r}")
    return value


def parse_time(text: str) -> float:
    """``'5ms'`` -> 0.005 seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|ms|us)\s*", str(text))
    if not m:
        raise ConfigError(f"a time is a number and s, ms or us (e.g. 5ms), got {text!r}")
    return float(m.group(1)) * _TIME_UNITS[m.group(2)]


def parse_percent(text: str) -> float:
    """``'0.1%'`` -> 0.001."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*%\s*", str(text))
    if not m or float(m.group(1)) >= 100:
        raise ConfigError(f"a loss is a percentage below 100 (e.g. 0.1%), got {text!r}")
    return float(m.group(1)) / 100


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """H hosts of R ranks each, every host one network namespace behind one shaped link."""

    hosts: int = 2
    """Emulated machines (network namespaces), 2 to 64."""
    ranks_per_host: int = 1
    """torchrun processes per host (``--nproc-per-node``)."""
    rate_bps: float = 1e9
    """Each host's link rate in bits per second, in each direction (tbf on both ends of
    its veth, like a full-duplex NIC port)."""
    delay_s: float = 0.0
    """One-way delay added to every packet a host sends (netem, or the user-space delay line
    of :mod:`commgnn.cluster.delayline` where the kernel has no netem); a round trip between
    two hosts takes twice this."""
    jitter_s: float = 0.0
    """Uniform jitter around ``delay_s`` (needs a delay); packets keep their order."""
    loss: float = 0.0
    """Fraction of the (1500-byte) packets a host sends that are dropped (TCP retransmits them)."""
    rdzv_port: int = 29400
    """Port of torchrun's c10d rendezvous store on host 0."""
    host_cpus: tuple[float, ...] = ()
    """Per host, the cores its processes may use together (``0.5``: half a core), enforced by
    one CPU cgroup a host (cgroup v1 ``cpu.cfs_quota_us``, v2 ``cpu.max``); empty: no limit.
    Their sum must stay below the machine's cores, so that each host's speed is its quota
    and not the noise of the others (:mod:`commgnn.cluster.cpu`)."""
    host_rates_bps: tuple[float, ...] = ()
    """Per host, its link rate in bits per second (each direction); empty: ``rate_bps`` for
    every host. A host behind a slower link, e.g. ``1gbit,1gbit,1gbit,100mbit``."""
    straggle: tuple[str, ...] = ()
    """Transient stragglers, ``HOST:every=TIME:for=TIME`` each (``3:every=5s:for=1s``): every
    ``every`` that host's ranks are stopped (SIGSTOP) for ``for``, then continued
    (:mod:`commgnn.cluster.straggle`). ``for`` must stay below the job's heartbeat time-out
    (``runtime.heartbeat_s``), or its ranks are declared dead."""

    def __post_init__(self) -> None:
        if not 2 <= self.hosts <= 64:
            raise ConfigError(f"--hosts must be between 2 and 64, got {self.hosts}")
        if not 1 <= self.ranks_per_host <= 64:
            raise ConfigError(f"--ranks-per-host must be between 1 and 64, got {self.ranks_per_host}")
        if self.rate_bps < 8e3:
            raise ConfigError(f"--rate must be at least 8kbit, got {self.rate_bps:g} bit/s")
        if self.delay_s < 0 or self.delay_s > 10:
            raise ConfigError(f"--delay must be between 0 and 10s, got {self.delay_s:g}s")
        if self.jitter_s < 0 or (self.jitter_s and not self.delay_s) or self.jitter_s > self.delay_s:
            raise ConfigError("--jitter needs a --delay at least as large")
        if not 0 <= self.loss < 1:
            raise ConfigError(f"--loss must be below 100%, got {self.loss:.2%}")
        if not 1024 <= self.rdzv_port <= 65535:
            raise ConfigError(f"--rdzv-port must be between 1024 and 65535, got {self.rdzv_port}")
        for name, values in (("--host-cpus", self.host_cpus), ("--host-rate", self.host_rates_bps)):
            if values and len(values) != self.hosts:
                raise ConfigError(f"{name} gives {len(values)} values for {self.hosts} hosts: give one a host")
        if any(not 0.01 <= c <= 1024 for c in self.host_cpus):
            raise ConfigError(f"--host-cpus must be between 0.01 and 1024 cores a host, got {self.host_cpus}")
        if any(r < 8e3 for r in self.host_rates_bps):
            raise ConfigError(f"--host-rate must be at least 8kbit a host, got {self.host_rates_bps}")
        for host, every, length in self.stragglers:
            if not 0 <= host < self.hosts:
                raise ConfigError(f"--straggle names host {host}; the hosts are 0 to {self.hosts - 1}")
            if not 0 < length < every:
                raise ConfigError(f"--straggle {host}: for= ({length:g}s) must be above 0 and below every= "
                                  f"({every:g}s)")

    @property
    def stragglers(self) -> tuple[tuple[int, float, float], ...]:
        """:attr:`straggle` read: ``(host, every_s, for_s)`` each."""
        return tuple(parse_straggle_item(item) for item in self.straggle)

    def rate_of(self, host: int) -> float:
        """Host ``host``'s link rate in bits per second."""
        return self.host_rates_bps[host] if self.host_rates_bps else self.rate_bps

    @property
    def world_size(self) -> int:
        return self.hosts * self.ranks_per_host

    @property
    def needs_netem(self) -> bool:
        return bool(self.delay_s or self.loss)

    def address(self, host: int) -> str:
        """Host ``host``'s address in 198.18.0.0/15 (RFC 2544's benchmarking range)."""
        return f"198.18.{(host + 1) // 256}.{(host + 1) % 256}"

    def describe(self) -> str:
        rates = self.host_rates_bps or (self.rate_bps,)
        text = ",".join(f"{r / 1e9:g} Gbit/s" if r >= 1e9 else f"{r / 1e6:g} Mbit/s" for r in rates)
        if self.delay_s:
            text += f", {self.delay_s * 1e3:g} ms delay"
            if self.jitter_s:
                text += f" ± {self.jitter_s * 1e3:g} ms"
        if self.loss:
            text += f", {self.loss:.2%} loss"
        if self.host_cpus:
            text += ", cores " + ",".join(f"{c:g}" for c in self.host_cpus)
        for h, every, length in self.stragglers:
            text += f", host {h} stopped {length:g} s every {every:g} s"
        return f"{self.hosts} hosts x {self.ranks_per_host} ranks, {text}"


def parse_list(parse: Any) -> Any:
    """``parse`` over a comma-separated list: ``'1gbit,100mbit'`` -> ``(1e9, 1e8)``."""
    def read(text: str) -> tuple[Any, ...]:
        parts = [p for p in str(text).split(",") if p.strip()]
        if not parts:
            raise ConfigError(f"give one value a host, separated by commas, got {text!r}")
        return tuple(parse(p) for p in parts)
    read.__name__ = f"list of {getattr(parse, '__name__', 'values')}"
    return read


def parse_cores(text: str) -> float:
    """``'0.5'`` -> 0.5 cores."""
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"a CPU share is a number of cores (e.g. 0.5), got {text!r}") from None


def parse_straggle_item(item: str) -> tuple[int, float, float]:
    """``'3:every=5s:for=1s'`` -> ``(3, 5.0, 1.0)``."""
    m = re.fullmatch(r"\s*(\d+):every=([^:]+):for=([^:]+)\s*", str(item))
    if not m:
        raise ConfigError(f"a straggler is HOST:every=TIME:for=TIME (e.g. 3:every=5s:for=1s), got {item!r}")
    return int(m.group(1)), parse_time(m.group(2)), parse_time(m.group(3))


def parse_straggle(text: str) -> tuple[str, ...]:
    """``'3:every=5s:for=1s,0:every=10s:for=2s'`` -> one checked entry a straggler."""
    items = tuple(p.strip() for p in str(text).split(",") if p.strip())
    for item in items or (text,):
        parse_straggle_item(item)
    return items


def flag_value(parse: Any) -> Any:
    """``parse`` as an argparse ``type``: its :class:`ConfigError` becomes argparse's one-line
    usage error."""
    def read(text: str) -> Any:
        try:
            return parse(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    read.__name__ = parse.__name__
    return read


def rate_text(bps: float) -> str:
    """1e9 -> ``1gbit`` (as ``tc`` writes a rate)."""
    for unit, scale in (("tbit", 1e12), ("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g}{unit}"
    return f"{bps:g}bit"


def time_text(seconds: float) -> str:
    """0.005 -> ``5ms``."""
    return f"{seconds * 1e3:g}ms"


def percent_text(fraction: float) -> str:
    """0.001 -> ``0.1%``."""
    return f"{fraction * 100:g}%"


CLUSTER_OPTIONS = OptionSet("cluster", lambda: ClusterConfig, (
    opt("hosts", "--hosts", "emulated machines"),
    opt("ranks_per_host", "--ranks-per-host", "ranks per host, torchrun's --nproc-per-node"),
    opt("rate_bps", "--rate", "each host's link rate per direction, tc units", parse=flag_value(parse_rate),
        show=rate_text, dest="rate"),
    opt("delay_s", "--delay", "one-way delay per host, e.g. 5ms (netem, or the user-space delay line where the "
        "kernel has no netem)", parse=flag_value(parse_time), show=time_text, dest="delay"),
    opt("jitter_s", "--jitter", "uniform jitter around --delay, e.g. 1ms", parse=flag_value(parse_time),
        show=time_text, dest="jitter"),
    opt("loss", "--loss", "packet loss per host, e.g. 0.1% (of 1500-byte packets)", parse=flag_value(parse_percent),
        show=percent_text),
    opt("rdzv_port", "--rdzv-port", "rendezvous port on host 0"),
    opt("host_cpus", "--host-cpus", "cores each host may use, e.g. 0.5,0.5,0.5,0.125 (a CPU cgroup a host)",
        parse=flag_value(parse_list(parse_cores)), show=lambda v: ",".join(f"{c:g}" for c in v) or "none"),
    opt("host_rates_bps", "--host-rate", "each host's own link rate, e.g. 1gbit,1gbit,1gbit,100mbit",
        parse=flag_value(parse_list(parse_rate)), show=lambda v: ",".join(rate_text(r) for r in v) or "--rate's",
        dest="host_rate"),
    opt("straggle", "--straggle", "transient stragglers, HOST:every=5s:for=1s (the host's processes stopped, "
        "then continued; several separated by commas)", parse=flag_value(parse_straggle), show=lambda v: ",".join(v) or "none"),
))
"""The options of ``commgnn cluster`` (:class:`ClusterConfig`): rates, times and losses
are written in ``tc`` units (``100mbit``, ``5ms``, ``0.1%``)."""
