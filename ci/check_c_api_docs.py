"""Fails when a TE_API function of core/include/te/*.h is missing from docs/c_api.md."""

import glob
import re
import sys

declared = set()
for header in glob.glob("core/include/te/*.h"):
    declared |= set(re.findall(r"TE_API\s+[\w\s\*]+?\b(te_\w+)\s*\(", open(header).read()))
documented = open("docs/c_api.md").read()
missing = sorted(name for name in declared if name not in documented)
if missing:
    sys.exit(f"docs/c_api.md does not document: {', '.join(missing)}")
print(f"docs/c_api.md documents all {len(declared)} C entry points")
