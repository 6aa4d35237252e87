"""The outputs: a PNG of the loss curves, a markdown and an HTML report, and the raw results (JSON)."""

from __future__ import annotations

import html
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing mean over `window` steps (the per-step loss of a small batch is noisy)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def final_loss(result: dict) -> float:
    """The mean training loss over the last 10% of the steps."""
    losses = result["losses"]
    tail = losses[-max(1, len(losses) // 10) :]
    return sum(tail) / len(tail)


def plot(results: list[dict], path: Path, title: str) -> None:
    fig, (full, end) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in results:
        if "losses" not in r:
            continue
        window = max(1, len(r["losses"]) // 30)
        curve = smooth(r["losses"], window)
        full.plot(curve, label=r["name"], linewidth=1.2)
        half = len(curve) // 2
        end.plot(range(half, len(curve)), curve[half:], label=r["name"], linewidth=1.2)
    full.set(xlabel="step", ylabel="training loss (nats/byte, smoothed)", title=title)
    end.set(xlabel="step", title="second half (zoomed)")
    for ax in (full, end):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def rows(results: list[dict]) -> list[list[str]]:
    """The table: one row per recipe; gaps relative to the BF16 run (when it ran)."""
    base = next((r for r in results if r["name"] == "BF16" and "losses" in r), None)
    table = []
    for r in results:
        if "losses" not in r:
            table.append([r["name"], "failed: " + r["error"], "", "", "", "", ""])
            continue
        loss, val = final_loss(r), r["val_loss"]
        gap = f"{loss - final_loss(base):+.4f}" if base else "n/a"
        val_gap = f"{val - base['val_loss']:+.4f}" if base else "n/a"
        table.append([r["name"], f"{loss:.4f}", gap, f"{val:.4f}", val_gap, f"{r['tokens_per_s']:,.0f}", memory(r)])
    return table


def memory(result: dict) -> str:
    """Peak MiB; on the CPU also the growth over the worker's RSS when it started."""
    text = f"{result['peak_mib']:,.0f}"
    if result.get("start_mib") is not None:
        text += f" (+{result['peak_mib'] - result['start_mib']:,.0f})"
    return text


HEADER = ["recipe", "final train loss", "gap to BF16", "val loss", "val gap to BF16", "tokens/s", "peak MiB"]


def markdown(results: list[dict], meta: dict, png: str) -> str:
    lines = [f"# {meta['title']}", "", *[f"- {k}: {v}" for k, v in meta["facts"].items()], ""]
    lines += ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in rows(results)]
    lines += ["", meta["notes"], "", f"![loss curves]({png})", "", "## Samples (KV cache, top-k 5, fixed seed)", ""]
    for r in results:
        if "sample" in r:
            prompt, rest = r["sample"][: r["prompt_chars"]], r["sample"][r["prompt_chars"] :]
            lines += [f"### {r['name']}", "", "prompt: `" + prompt.replace("`", "'").replace("\n", "⏎") + "`", ""]
            lines += ["```text", prompt + rest, "```", ""]
    warns = [f"- {r['name']}: {w}" for r in results for w in r.get("warnings", [])]
    if warns:
        lines += ["## Warnings raised during the runs", "", *warns]
    return "\n".join(lines) + "\n"


def to_html(results: list[dict], meta: dict, png: str) -> str:
    esc = html.escape
    facts = "".join(f"<li>{esc(k)}: {esc(str(v))}</li>" for k, v in meta["facts"].items())
    head = "".join(f"<th>{esc(h)}</th>" for h in HEADER)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows(results))
    samples = "".join(
        f"<h3>{esc(r['name'])}</h3><pre><b>{esc(r['sample'][: r['prompt_chars']])}</b>"
        f"{esc(r['sample'][r['prompt_chars'] :])}</pre>"
        for r in results
        if "sample" in r
    )
    warns = "".join(f"<li>{esc(r['name'])}: {esc(w)}</li>" for r in results for w in r.get("warnings", []))
    warns = f"<h2>Warnings raised during the runs</h2><ul>{warns}</ul>" if warns else ""
    style = "body{font-family:sans-serif;max-width:1100px;margin:auto}td,th{border:1px solid #ccc;padding:4px 8px}"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(meta['title'])}</title>"
        f"<style>{style}table{{border-collapse:collapse}}pre{{background:#f6f6f6;padding:8px;white-space:pre-wrap}}"
        f"</style></head><body><h1>{esc(meta['title'])}</h1><ul>{facts}</ul><table><tr>{head}</tr>{body}</table>"
        f"<p>{esc(meta['notes'])}</p><img src='{esc(png)}' alt='loss curves' style='max-width:100%'>"
        f"<h2>Samples (KV cache, top-k 5, fixed seed; prompt in bold)</h2>{samples}"
        f"{warns}</body></html>\n"
    )


def write(results: list[dict], meta: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    png = out / "loss_curves.png"
    plot(results, png, meta["title"])
    paths = [png, out / "report.md", out / "report.html", out / "results.json"]
    paths[1].write_text(markdown(results, meta, png.name), encoding="utf-8")
    paths[2].write_text(to_html(results, meta, png.name), encoding="utf-8")
    paths[3].write_text(json.dumps(dict(meta=meta, results=results), indent=1), encoding="utf-8")
    return paths
