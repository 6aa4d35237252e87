"""Checks the public C API of core/include/te/*.h against docs/c_api.md.

Fails when a TE_API function is missing from docs/c_api.md, or when one that is
not a deprecated alias (TE_DEPRECATED) breaks the naming rule of docs/c_api.md:
te_<family>_<verb>, <family> the header's name (= the core/src folder), or an
op of a family that holds several (NAMED_OPS); types.h's library-wide queries
have no family.
"""

import glob
import os
import re
import sys

# Families whose header holds several ops named by the op, not the family.
NAMED_OPS = {"norm.h": ("layernorm", "rmsnorm")}
NO_FAMILY = {"types.h"}

declaration = re.compile(r"(TE_DEPRECATED\([^)]*\)\s*)?TE_API\s+[\w\s\*]+?\b(te_\w+)\s*\(")
declared, misnamed = set(), []
for header in sorted(glob.glob("core/include/te/*.h")):
    base = os.path.basename(header)
    prefixes = NAMED_OPS.get(base, (base[: -len(".h")],))
    for deprecated, name in declaration.findall(open(header).read()):
        declared.add(name)
        if deprecated or base in NO_FAMILY:
            continue
        if not any(name == f"te_{p}" or name.startswith(f"te_{p}_") for p in prefixes):
            misnamed.append(f"{name} ({base}: expected te_{'/'.join(prefixes)}_<verb>)")
documented = open("docs/c_api.md").read()
missing = sorted(name for name in declared if not re.search(rf"\b{name}\b", documented))
errors = []
if missing:
    errors.append(f"docs/c_api.md does not document: {', '.join(missing)}")
if misnamed:
    errors.append("entry points breaking the te_<family>_<verb> rule (docs/c_api.md): " + ", ".join(misnamed))
if errors:
    sys.exit("\n".join(errors))
print(f"docs/c_api.md documents all {len(declared)} C entry points; their names follow the rule")
