"""What every benchmark does at the end: print its Markdown report and keep it in runs/bench/."""

from pathlib import Path

OUT = Path("runs/bench")


def publish(name: str, title: str, report: str) -> None:
    print(report)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.md").write_text(f"# {title}\n\n{report}\n")
