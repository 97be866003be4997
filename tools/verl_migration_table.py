"""Print the key tables of docs/verl-migration.md from megarl.config.verl_keys.VERL_KEYS (paste them
over the doc's; tests/unit/config/test_verl_keys.py fails while the two differ).

    PYTHONPATH=. python tools/verl_migration_table.py
"""

from __future__ import annotations

from megarl.config.verl_keys import VERL_KEYS


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def main() -> None:
    print("| verl key | megarl key | note |\n|---|---|---|")
    for k in VERL_KEYS:
        if k.megarl is not None:
            megarl = f"`{k.megarl}`" + (" (must agree)" if k.kind == "same" else "")
            print(f"| `{k.verl}` | {megarl} | {_cell(k.note)} |")
    print("\n| verl key (ignored, one warning line) | why |\n|---|---|")
    for k in VERL_KEYS:
        if k.megarl is None:
            print(f"| `{k.verl}` | {_cell(k.note)} |")


if __name__ == "__main__":
    main()
