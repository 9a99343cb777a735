#!/usr/bin/env bash
# README stays true: its configuration table lists every setting the engine has (the core's and
# every transport's, as `mooncake-info --config` prints them) and nothing else, each with its
# default when the default is a value (not empty, not derived from the environment).
set -euo pipefail
readme=${MC_SOURCE_DIR:?}/README.md
info=${MC_BUILD_DIR:?}/bin/mooncake-info

SETTINGS=$(env -i PATH="$PATH" "$info" --config) python3 - "$readme" <<'EOF'
import os, re, sys
settings = os.environ["SETTINGS"].splitlines()[1:]
readme = open(sys.argv[1], encoding="utf-8").read()
table = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
rows = {}
for line in table.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) < 3 or not cells[0].startswith("`MC_"):
        continue
    for name in re.findall(r"`(MC_\w+)`", cells[0]):
        rows[name] = cells[1]
bad = 0
declared = set()
for line in settings:
    name, value, default = line.split()[:3]
    declared.add(name)
    if name not in rows:
        print(f"README: {name} is missing from the configuration table")
        bad += 1
    elif default != "-" and "$" not in default and f"`{default}`" not in rows[name]:
        print(f"README: {name}: default is {default}, the table says {rows[name]}")
        bad += 1
for name in sorted(set(rows) - declared):
    print(f"README: {name} is in the configuration table but is no setting of the engine")
    bad += 1
if bad:
    sys.exit(1)
print(f"README lists all {len(declared)} settings with their defaults")
EOF
