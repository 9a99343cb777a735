#!/usr/bin/env python3
"""The core names no transport.

Every transport reaches the engine through engine/transport/transport.h and is listed in
engine/transport/table.c; the core (the files directly in engine/: engine, memory, peers,
batches, scheduler, messages, descriptors...) must reach transports only through that table.
The layers below it (engine/util, metadata, topology, sys) know no transport either, and
topology names RDMA devices, which are devices, not a transport. This check fails, naming file,
line and identifier, when a core file (comments and string literals aside):
  1. uses an identifier that a transport defines in its own headers
     (engine/transport/<name>/*.h): a type, a function, a macro, an enum constant or a variable
     (mc_tcp_conn_t, mc__rdma_fill, MC_RDMA_MAX_DEVS, CS_READY, mc__shm_slot...);
  2. or names a transport in an identifier: a word of the table's transport names ("tcp",
     "shm", "rdma") or of the libraries they load ("ibv") between underscores or case changes,
     as in e->rdma, tcp_c, MC_TP_TCP, mc__shm_submit.

Usage: check_transport_seam.py ENGINE_DIR   (exit 0: clean, 1: violations listed)
"""
import os
import re
import sys

IDENT = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")


def strip_c(text):
    """Blank out comments, string and character literals, keeping line numbers."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else " " * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "defined", "__attribute__",
            "format", "printf", "_Static_assert", "_Alignas", "offsetof", "enum", "struct",
            "union", "typedef"}


def definitions(path):
    """Names a header defines at file scope: macros, types, tags, enum constants, functions and
    variables (not struct fields, whose names are common words)."""
    with open(path, encoding="utf-8") as f:
        text = strip_c(f.read())
    names = set(re.findall(r"^\s*#\s*define\s+(\w+)", text, re.M))
    text = re.sub(r"^\s*#.*$", "", text, flags=re.M)
    names.update(re.findall(r"\b(?:struct|union|enum)\s+(\w+)\s*\{", text))
    for body in re.findall(r"\benum\b[^{;]*\{([^}]*)\}", text):
        names.update(re.findall(r"(?:^|,)\s*(\w+)", body))
    depth, stmt = 0, ""
    for c in text:
        if c == "{":
            if depth == 0:
                names.update(declared(stmt))
                stmt = ""
            depth += 1
        elif c == "}":
            depth -= 1
        elif depth == 0:
            if c == ";":
                names.update(declared(stmt))
                stmt = ""
            else:
                stmt += c
    return names - KEYWORDS


def declared(stmt):
    """The name a file-scope declaration introduces: 'int mc__x(int a)' -> mc__x,
    'typedef struct a { } a_t' -> a_t (the tail after the braces), 'extern unsigned s' -> s."""
    stmt = stmt.strip()
    if not stmt:
        return []
    m = re.match(r"[\w\s\*]*?\b(\w+)\s*\(", stmt)
    if m and not stmt.startswith("typedef"):
        return [m.group(1)]
    m = re.search(r"\(\s*\*\s*(\w+)\s*\)", stmt)  # typedef of a function pointer
    if m:
        return [m.group(1)]
    m = re.search(r"(\w+)\s*(?:\[[^\]]*\])?\s*$", stmt)
    return [m.group(1)] if m else []


def idents(path):
    with open(path, encoding="utf-8") as f:
        return IDENT.findall(strip_c(f.read()))


def words(ident):
    """'MC_TP_TCP' -> mc tp tcp; 'rdmaRails' -> rdma rails."""
    parts = []
    for chunk in ident.split("_"):
        parts += re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", chunk)
    return [p.lower() for p in parts]


def main():
    engine = sys.argv[1] if len(sys.argv) > 1 else "engine"
    tdir = os.path.join(engine, "transport")
    with open(os.path.join(tdir, "table.c"), encoding="utf-8") as f:
        names = set(re.findall(r"&mc__(\w+)_ops", strip_c(f.read())))
    if not names:
        print("no transport found in table.c")
        return 1
    names.add("ibv")

    core = sorted(os.path.join(engine, fn) for fn in os.listdir(engine)
                  if fn.endswith((".c", ".h")))
    private = set()
    for root, _, files in os.walk(tdir):
        if root == tdir:
            continue
        for fn in files:
            if fn.endswith(".h"):
                private.update(definitions(os.path.join(root, fn)))

    bad = 0
    for path in core:
        with open(path, encoding="utf-8") as f:
            lines = strip_c(f.read()).split("\n")
        for no, line in enumerate(lines, 1):
            for ident in IDENT.findall(line):
                why = None
                if ident in private:
                    why = "defined by a transport"
                elif names & set(words(ident)):
                    why = "names a transport"
                if why:
                    print(f"{path}:{no}: {ident}: {why}")
                    bad += 1
    if bad:
        print(f"{bad} place(s) where the core names a transport: reach it through "
              "engine/transport/transport.h instead")
        return 1
    print(f"core files: {len(core)}, transport-private identifiers: {len(private)}, "
          f"transports: {', '.join(sorted(names - {'ibv'}))}: the core names none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
