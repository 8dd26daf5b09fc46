#!/usr/bin/env python3
"""launch.py SRC.cu DST.cpp — rewrite the kernel launches of a kernels/*.cu
file for the CPU emulation: name<<<grid, block[, shmem[, stream]]>>>(args)
becomes emu_launch(grid, block, shmem, name, "name", args); the name is
for the emulation's messages."""
import pathlib
import re
import sys


def split_top(text):
    """Split on the commas that are not inside parentheses or brackets."""
    parts, depth, cur = [], 0, ''
    for ch in text:
        depth += ch in '(['
        depth -= ch in ')]'
        if ch == ',' and depth == 0:
            parts.append(cur.strip())
            cur = ''
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


def rewrite(m):
    name = m.group(1)
    cfg = split_top(m.group(2))
    shmem = cfg[2] if len(cfg) > 2 else '0'
    return f'emu_launch({cfg[0]}, {cfg[1]}, {shmem}, {name}, "{name}", '


src, dst = sys.argv[1], sys.argv[2]
# a kernel name, optionally with template arguments: k<<<...>>>( or k<float><<<...>>>(
launch = r'([A-Za-z_]\w*(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>\('
text = re.sub(launch, rewrite, pathlib.Path(src).read_text(), flags=re.S)
# a launch without arguments left "name, "name", )"
text = re.sub(r'(emu_launch\([^;]*?),\s*\)', r'\1)', text)
pathlib.Path(dst).write_text(text)
