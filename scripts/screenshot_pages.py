"""Screenshots of the operator's pages of a running dashboard (e.g. ``make demo``), in Debian's
headless Chromium at 1400x900: the first screen, a group page (heatmap on a chosen signal), a node
page and the threshold preview. For before/after comparisons of a change to the pages.

    .venv/bin/python scripts/screenshot_pages.py --base http://127.0.0.1:8000 --password PW \\
        --prefix before --out docs/screenshots/issue-26

Writes ``<out>/<prefix>-first-screen.png``, ``-group.png``, ``-node.png``, ``-preview.png`` and prints
their paths. Logs in as ``--user`` (the demo's ``demo``: it has the roles the preview needs).
"""

from __future__ import annotations

import argparse
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="http://127.0.0.1:8000")
    ap.add_argument("--user", default="demo")
    ap.add_argument("--password", required=True)
    ap.add_argument("--group", default="demo-qwen2-72b-a100", help="group slug of the group and preview pages")
    ap.add_argument("--node", default="a100-02", help="name of the node page's node (in --group)")
    ap.add_argument("--signal", default="", help="?signal= of the group page (default: the deciding one)")
    ap.add_argument("--preview", default="quarantine_z=15", help="FIELD=VALUE previewed on the thresholds page")
    ap.add_argument("--only", default="first-screen,group,node,preview",
                    help="which pages, comma-separated (first-screen, group, node, preview)")
    ap.add_argument("--prefix", default="shot")
    ap.add_argument("--out", type=Path, default=Path("reports/screenshots"))
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=900)
    args = ap.parse_args(argv)

    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    base = args.base.rstrip("/")

    only = set(args.only.split(","))

    def shot(pg: object, name: str) -> None:
        if name not in only:
            return
        path = args.out / f"{args.prefix}-{name}.png"
        pg.screenshot(path=str(path), full_page=True)
        print(path)

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        pg = browser.new_context(viewport={"width": args.width, "height": args.height}).new_page()
        pg.set_default_timeout(20_000)
        pg.goto(f"{base}/accounts/login/?next=/")
        pg.get_by_label("Username").fill(args.user)
        pg.get_by_label("Password").fill(args.password)
        pg.get_by_role("button", name="Log in").click()
        pg.wait_for_url(f"{base}/")
        shot(pg, "first-screen")

        query = f"?signal={args.signal}" if args.signal else ""
        pg.goto(f"{base}/groups/{args.group}/{query}")
        shot(pg, "group")
        pg.locator("#nodes-table a", has_text=args.node).first.click()
        pg.wait_for_load_state()
        shot(pg, "node")

        field, _, value = args.preview.partition("=")
        pg.goto(f"{base}/groups/{args.group}/thresholds/")
        pg.locator(f"#id_{field}").fill(value)
        pg.get_by_role("button", name="Preview").click()
        # The replay of an hour takes seconds; a refused preview shows its error instead.
        pg.locator("#preview, [role=alert]").first.wait_for(timeout=120_000)
        shot(pg, "preview")
        pg.goto("about:blank")  # stop the pages' live refresh
        browser.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
