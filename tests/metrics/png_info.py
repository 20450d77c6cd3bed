#!/usr/bin/env python3
"""Check a PNG and print "WIDTH HEIGHT COLOURS" (test_status_page's screenshot check).

Validates the signature, every chunk's CRC, IHDR (8-bit RGB or RGBA, not interlaced) and that
the IDAT stream inflates to exactly HEIGHT rows of WIDTH pixels; then un-filters the first
ROWS rows (pure Python: the whole image would take seconds) and counts their distinct colours.
Exit 0 with the line on stdout, 1 with the reason on stderr.
"""
import struct
import sys
import zlib

ROWS = 240


def paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def unfilter(ftype, row, prev, bpp):
    out = bytearray(row)
    for i in range(len(out)):
        a = out[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if ftype == 1:
            out[i] = (out[i] + a) & 0xFF
        elif ftype == 2:
            out[i] = (out[i] + b) & 0xFF
        elif ftype == 3:
            out[i] = (out[i] + ((a + b) >> 1)) & 0xFF
        elif ftype == 4:
            out[i] = (out[i] + paeth(a, b, c)) & 0xFF
        elif ftype != 0:
            raise ValueError(f"filter type {ftype}")
    return out


def main(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG signature")
    pos, ihdr, idat = 8, None, bytearray()
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        if zlib.crc32(kind + body) != crc:
            raise ValueError(f"bad CRC in chunk {kind!r}")
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
        pos += 12 + n
    if not ihdr:
        raise ValueError("no IHDR")
    w, h, depth, ctype, _, _, interlace = ihdr
    if depth != 8 or ctype not in (2, 6) or interlace:
        raise ValueError(f"unexpected format: depth {depth}, colour type {ctype}, interlace {interlace}")
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(bytes(idat))
    stride = 1 + w * bpp
    if len(raw) != h * stride:
        raise ValueError(f"{len(raw)} bytes of pixel data, {h * stride} expected")
    colours, prev = set(), bytearray(w * bpp)
    for y in range(min(h, ROWS)):
        row = unfilter(raw[y * stride], raw[y * stride + 1:(y + 1) * stride], prev, bpp)
        colours.update(bytes(row[i:i + bpp]) for i in range(0, len(row), bpp))
        prev = row
    print(w, h, len(colours))


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except (OSError, ValueError, struct.error, zlib.error) as e:
        print(f"png_info: {sys.argv[1]}: {e}", file=sys.stderr)
        sys.exit(1)
