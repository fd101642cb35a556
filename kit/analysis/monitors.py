"""Monitor series of a run dir (``monitors/``) and their figure beside the step times.

``read_monitors`` turns the samplers' files into time series (seconds since the monitors started):
GPU SM utilisation, memory in use and power from ``nvidia-smi dmon``, host CPU % and memory from the
psutil CSV, else CPU % and free memory from ``vmstat``. ``monitor_figure`` draws them per arm with each step's time, the steps placed on the
same clock by counting back from the job's end (the monitors stop when the job does). Example::

    series = read_monitors(Path("runs/r1"))       # {"interval_s": 1.0, "gpu": {...}, "host": {...}} or None
    monitor_figure({"r1": (series, step_times)}, Path("out"), "controlled comparison")
"""

from __future__ import annotations

import csv
from pathlib import Path
from kit.analysis.plots import _pyplot, _save
from kit.model.documents import read_json_file
from kit.model.regular_files import MAX_LOG_BYTES, read_regular_text

MONITORS_JSON = "monitors/monitors.json"
FIGURE = "monitors"


def has_monitors(run_dir: Path) -> bool:
    return (Path(run_dir) / MONITORS_JSON).is_file()


def _clock(text: str) -> float | None:
    try:
        h, m, s = (int(x) for x in text.split(":"))
    except ValueError:
        return None
    return h * 3600.0 + m * 60.0 + s


def parse_dmon(text: str) -> dict:
    """``nvidia-smi dmon -o T`` lines -> {"t": [...], "sm_pct": [...], "fb_gib": [...], "power_w": [...]} (GPU 0)."""
    columns, out, start, last = None, {"t": [], "sm_pct": [], "fb_gib": [], "power_w": []}, None, None
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if fields[0] == "#Time":
            columns = [f.lower() for f in fields[1:]]
            continue
        if fields[0].startswith("#") or columns is None or len(fields) != len(columns) + 1:
            continue
        row = dict(zip(columns, fields[1:]))
        if row.get("gpu") not in ("0", None):
            continue
        t = _clock(fields[0])
        if t is None:
            continue
        if last is not None and t < last:       # past midnight
            t += 86400.0
        start = t if start is None else start
        last = t

        def number(key):
            try:
                return float(row[key])
            except (KeyError, ValueError):
                return None
        out["t"].append(t - start)
        out["sm_pct"].append(number("sm"))
        fb = number("fb")
        out["fb_gib"].append(None if fb is None else fb / 1024.0)
        out["power_w"].append(number("pwr"))
    return out


def parse_psutil(text: str) -> dict:
    """The psutil CSV -> {"t": [...], "cpu_pct": [...], "mem_gib": [...]}."""
    out = {"t": [], "cpu_pct": [], "mem_gib": []}
    for row in csv.DictReader(text.splitlines()):
        try:
            out["t"].append(float(row["time_s"]))
            out["cpu_pct"].append(float(row["cpu_percent"]))
            out["mem_gib"].append(float(row["memory_used_bytes"]) / 2**30)
        except (KeyError, TypeError, ValueError):
            continue
    return out


def parse_vmstat(text: str) -> dict:
    """``vmstat -n -t 1`` lines -> {"t": [...], "cpu_pct": [...] (user + system), "wait_pct", "idle_pct",
    "free_mib"}: the host series the kit records where psutil is not installed (it is no declared dependency)."""
    import datetime as _dt

    header, out, start = None, {"t": [], "cpu_pct": [], "wait_pct": [], "idle_pct": [], "free_mib": []}, None
    for line in text.splitlines():
        fields = line.split()
        if "us" in fields and "free" in fields:
            header = fields
            continue
        if header is None or len(fields) < len(header) or not fields[0].isdigit():
            continue
        row = dict(zip(header, fields))
        try:
            when = _dt.datetime.strptime(" ".join(fields[-2:]), "%Y-%m-%d %H:%M:%S")
            us, sy, wa, idle, free = (float(row[k]) for k in ("us", "sy", "wa", "id", "free"))
        except (KeyError, ValueError):
            continue
        start = start or when
        out["t"].append((when - start).total_seconds())
        out["cpu_pct"].append(us + sy)
        out["wait_pct"].append(wa)
        out["idle_pct"].append(idle)
        out["free_mib"].append(free / 1024.0)
    return out


def read_monitors(run_dir: Path) -> dict | None:
    """The run's monitor series, or None when it has no monitors/monitors.json."""
    run_dir = Path(run_dir)
    if not has_monitors(run_dir):
        return None
    doc = read_json_file(run_dir / MONITORS_JSON)
    if not isinstance(doc, dict):
        return None
    out = {"interval_s": doc.get("interval_s"), "gpu": None, "host": None,
           "missing": [s["name"] for s in doc.get("samplers", []) if s.get("status") != "recorded"]}
    for sampler in doc.get("samplers", []):
        path = run_dir / (sampler.get("file") or "")
        if sampler.get("status") != "recorded" or not path.is_file():
            continue
        text = read_regular_text(path, limit=MAX_LOG_BYTES, what="a monitor's samples")
        if sampler["name"] == "gpu" and sampler.get("tool") == "nvidia-smi":
            out["gpu"] = parse_dmon(text)
        elif sampler["name"] == "psutil":
            out["host"] = parse_psutil(text)
        elif sampler["name"] == "vmstat" and out["host"] is None:
            out["host"] = parse_vmstat(text)       # psutil's series, when recorded too, is kept instead
    return out


def step_clock(series: dict, step_times: list[float]) -> list[float]:
    """Each step's end on the monitors' clock: counted back from the last sample (the job's end)."""
    ends = [t for part in ("gpu", "host") if series.get(part) for t in series[part]["t"][-1:]]
    end = max(ends) if ends else sum(step_times)
    out, t = [], end
    for duration in reversed(step_times):
        out.append(t)
        t -= duration
    return list(reversed(out))


def monitor_figure(by_arm: dict, out_dir: Path, subtitle: str) -> list[str]:
    """``by_arm``: {arm: (series, step_times)}. Writes monitors.png/pdf: GPU SM %, GPU memory, host CPU %
    and step time against seconds since the monitors started."""

    plt = _pyplot()
    panels = [(part, key, label) for part, key, label in
              (("gpu", "sm_pct", "GPU SM utilisation (%)"), ("gpu", "fb_gib", "GPU memory in use (GiB)"),
               ("host", "cpu_pct", "host CPU, user + system (%)"))
              if any((series.get(part) or {}).get("t") for series, _ in by_arm.values())]
    # a monitor no run recorded gets no empty panel: the subtitle says it was not recorded
    absent = sorted({part for part in ("gpu", "host") if not any((s.get(part) or {}).get("t") for s, _ in by_arm.values())})
    if absent:
        subtitle = f"{subtitle}; not recorded by any run: {', '.join(absent)} monitor"
    fig, axes = plt.subplots(len(panels) + 1, 1, figsize=(9, 2.5 * (len(panels) + 1) + 0.6), sharex=True, squeeze=False)
    axes = list(axes.flat)
    for ax, (part, key, label) in zip(axes, panels):
        for arm, (series, _) in by_arm.items():
            data = series.get(part)
            if data and data["t"]:
                ax.plot(data["t"], [v if v is not None else float("nan") for v in data[key]], label=arm, lw=1)
            else:
                ax.plot([], [], label=f"{arm} (no {part} monitor)")
        ax.set_ylabel(label, fontsize=8)
        ax.legend(fontsize=7, loc="upper right")
    step_ax = axes[-1]
    for arm, (series, step_times) in by_arm.items():
        if step_times:
            step_ax.plot(step_clock(series, step_times), step_times, marker=".", lw=0.8, label=arm)
    step_ax.set_ylabel("step time (s), at each step's end", fontsize=8)
    step_ax.set_xlabel("time since the monitors started (s)", fontsize=8)
    step_ax.legend(fontsize=7, loc="upper right")
    fig.suptitle("monitors beside the step times", fontsize=10)
    height = fig.get_figheight()          # the x label and the 3-line footer take about 1.1 in, whatever the panels
    return _save(fig, out_dir, FIGURE, subtitle, margins={"bottom": 1.1 / height, "top": 1 - 0.55 / height, "hspace": 0.25})
