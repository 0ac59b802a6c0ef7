"""What the soak prints (a table of verbs and roles) and draws (memory, open files and threads over time)."""

from __future__ import annotations

from pathlib import Path

from tests.soak.load import WARM_UP, Calls, Series, Watches


def table(calls: dict[str, Calls], watches: Watches, events, series: dict[str, Series], seconds: float) -> str:
    lines = [f"soak: {seconds:.0f} s", f"{'verb':<10} {'rate/s':>8} {'p50 ms':>8} {'p99 ms':>8}  non-2xx"]
    for verb, got in calls.items():
        errors = ", ".join(f"{status or 'no answer'}: {n}" for status, n in sorted(got.errors.items())) or "none"
        lines.append(f"{verb:<10} {got.rate():8.1f} {got.quantile(0.5):8.1f} {got.quantile(0.99):8.1f}  {errors}")
    opened = Calls(latencies=list(watches.open_latencies))
    lines.append(
        f"{'watch':<10} {watches.count:>8} {opened.quantile(0.5):8.1f} {opened.quantile(0.99):8.1f}  "
        f"(opening; {sum(watches.events):,} events read, fewest on one watch {min(watches.events):,}, "
        f"{watches.reconnects} reconnects, {watches.failures} failures{failures_why(watches)})"
    )
    took = f"{len(events.writes):,} changes at {events.achieved:.0f}/s, {events.failed} refused or unanswered"
    lines.append(f"informer events: {took} (as many as kube-apiserver took)")
    lines.extend(memory_rows(series))
    return "\n".join(lines)


def failures_why(watches: Watches) -> str:
    return (": " + ", ".join(f"{why} {n}" for why, n in sorted(watches.why.items()))) if watches.why else ""


def memory_rows(series: dict[str, Series]) -> list[str]:
    """Each role's resident memory, open files and threads, first -> last sample, with the fitted slope, its
    verdict and the slopes of its two halves."""
    lines = [
        f"{'role':<10} {'RSS MB':>15} {'slope MB/min':>18} {'open files':>12} {'threads':>10} {'halves':>15}"
        "  (first -> last sample)"
    ]
    for name, s in series.items():
        slope, error = s.slope()
        verdict = leak_verdict(s, slope, error)
        earlier, later = halves(s)
        lines.append(
            f"{name:<10} {s.rss_mb[0]:6.0f} -> {s.rss_mb[-1]:6.0f} {slope:+8.2f} ± {error:5.2f} {verdict:<6}"
            f" {s.fds[0]:5d} -> {s.fds[-1]:<5d} {s.threads[0]:4d} -> {s.threads[-1]:<4d} {earlier:+7.2f} {later:+7.2f}"
        )
    return lines


def halves(s: Series) -> tuple[float, float]:
    """The slope (MB per minute) over each half of the fitted part of the run: a growth that slows towards
    zero is memory settling (a warm-up longer than the part left out); one that holds or rises is a leak."""
    middle = (WARM_UP + 1.0) / 2
    return s.slope(WARM_UP, middle)[0], s.slope(middle, 1.0)[0]


def leak_verdict(s: Series, slope: float, error: float) -> str:
    """ "flat" unless the fitted slope is beyond two standard errors of zero and what it adds over the run
    is more than noise (1 MB, or 1 % of the first sample)."""
    minutes = (s.seconds[-1] - s.seconds[0]) / 60
    if abs(slope) <= 2 * error or abs(slope) * minutes <= max(1.0, 0.01 * s.rss_mb[0]):
        return "flat"
    return "GROWS" if slope > 0 else "shrinks"


def plot(series: dict[str, Series], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(3, 1, figsize=(9, 10), sharex=True)
    for name, s in series.items():
        minutes = [t / 60 for t in s.seconds]
        for axis, values in zip(axes, (s.rss_mb, s.fds, s.threads), strict=True):
            axis.plot(minutes, values, label=name, marker=".")
    for axis, label in zip(axes, ("resident MB", "open files", "threads"), strict=True):
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
    axes[0].legend(loc="upper left", ncols=3)
    axes[-1].set_xlabel("minutes")
    figure.suptitle("soak: every role's processes over time")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    pyplot.close(figure)
