#!/usr/bin/env python3
"""Import loops between two files of a crate: each names the other by a
path (`use crate::..`, `super::..`, a module brought in by `use` or `mod`).
A module and its own submodule are left out (the parent declares the
child, the child uses the parent's items: Rust's usual shape).

    scripts/import-loops.py hook/src loader/src    # exit 1 on a loop
"""
import os, re, sys

def modpath(root, f):
    rel = os.path.relpath(f, root)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)

def strip_comments(s):
    s = re.sub(r'/\*.*?\*/', '', s, flags=re.S)
    return re.sub(r'//[^\n]*', '', s)

def expand(prefix, body):
    # body: text after 'use ', without ';'
    body = body.strip()
    m = re.match(r'^([\w:]*?)(::)?\{(.*)\}$', body, re.S)
    if m and body.endswith('}'):
        head = m.group(1)
        inner = m.group(3)
        parts, depth, cur = [], 0, ''
        for ch in inner:
            if ch == ',' and depth == 0:
                parts.append(cur); cur = ''; continue
            depth += ch == '{'; depth -= ch == '}'
            cur += ch
        parts.append(cur)
        out = []
        for p in parts:
            if p.strip():
                out += expand(prefix, (head + '::' if head else '') + p.strip())
        return out
    return [re.split(r'\s+as\s+', body)[0]]

def refs(root, f, files):
    me = modpath(root, f)
    src = strip_comments(open(f).read())
    # Inline modules (`mod tests { .. }`): `super` there is the file itself.
    spans = []
    for m in re.finditer(r'\bmod\s+\w+\s*\{', src):
        depth, i = 0, m.end() - 1
        while i < len(src):
            depth += src[i] == '{'; depth -= src[i] == '}'
            if depth == 0:
                break
            i += 1
        spans.append((m.start(), i))
    def inline(pos):
        return sum(a <= pos <= b for a, b in spans)
    paths = []
    for m in re.finditer(r'\buse\s+([^;]+);', src):
        paths += [(m.start(), p) for p in expand('', m.group(1))]
    paths += [(m.start(), m.group(0)) for m in re.finditer(r'(?<![\w:])(?:crate|super|self)(?:::\w+)+', src)]
    # Modules brought in by name (`use crate::cmd;`, `mod decide;`): paths
    # that start with that name.
    aliases = {n: me + (n,) for n in re.findall(r'^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;', src, re.M)}
    def resolve(pos, p):
        seg = [s for s in p.split('::') if s]
        if not seg:
            return None
        if seg[0] == 'crate':
            return tuple(seg[1:])
        if seg[0] in ('super', 'self'):
            cur, skip = me, inline(pos)
            while seg and seg[0] in ('super', 'self'):
                if seg[0] == 'super':
                    if skip:
                        skip -= 1
                    else:
                        cur = cur[:-1]
                seg = seg[1:]
            return cur + tuple(seg)
        if seg[0] in aliases:
            return aliases[seg[0]] + tuple(seg[1:])
        return None
    for pos, p in list(paths):
        full = resolve(pos, p)
        if full and full in files:
            aliases[p.split('::')[-1]] = full
    for n in aliases:
        paths += [(m.start(), m.group(0)) for m in re.finditer(r'(?<![\w:])' + n + r'(?:::\w+)+', src)]
    out = set()
    for pos, p in paths:
        full = resolve(pos, p)
        if full is None:
            continue
        for n in range(len(full), 0, -1):
            if full[:n] in files:
                if files[full[:n]] != f:
                    out.add(files[full[:n]])
                break
    return out

def main():
    bad = 0
    for root in sys.argv[1:]:
        fs = [os.path.join(d, n) for d, _, ns in os.walk(root) for n in ns if n.endswith('.rs')]
        files = {modpath(root, f): f for f in fs}
        g = {f: refs(root, f, files) for f in fs}
        for a in sorted(g):
            for b in sorted(g[a]):
                ma, mb = modpath(root, a), modpath(root, b)
                nested = ma == mb[:-1] or mb == ma[:-1]
                if a < b and a in g.get(b, ()) and not nested:
                    print(f"loop: {a} <-> {b}")
                    bad += 1
    sys.exit(1 if bad else 0)

main()
