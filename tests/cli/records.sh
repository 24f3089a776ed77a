#!/usr/bin/env bash
# `kiln records` end to end. Usage: records.sh KILN CASE; prints what kiln printed and
# "rc=<exit code>" for ctest's PASS_REGULAR_EXPRESSION.
#   roundtrip: IDX -> 2 gzip shards of Examples -> `show` decodes them; Python's gzip
#              module and a bitwise CRC-32C check the framing independently of kiln
#   corrupt:   a record with a bad data CRC: an error naming the offset, and
#              --skip-corrupt reads past it
#   missing:   from-idx with a missing IDX file
#   fmnist:    Fashion-MNIST (Debian's dataset-fashion-mnist) -> 2 zlib shards each
set -uo pipefail
KILN="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Tiny IDX files: 3 u8 images [3, 2, 3] with pixels 0..17, labels 7 8 9.
idx() {
  printf '\x00\x00\x08\x03\x00\x00\x00\x03\x00\x00\x00\x02\x00\x00\x00\x03' > "$work/images.idx"
  for i in $(seq 0 17); do printf "\\x$(printf %02x "$i")"; done >> "$work/images.idx"
  printf '\x00\x00\x08\x01\x00\x00\x00\x03\x07\x08\x09' > "$work/labels.idx"
}

case "$2" in
  roundtrip)
    idx
    "$KILN" records from-idx --images "$work/images.idx" --labels "$work/labels.idx" --out "$work/d" --shards 2 \
      --compression gzip || { echo "rc=$?"; exit 0; }
    "$KILN" records show "$work/d-00001-of-00002.tfrecord" || { echo "rc=$?"; exit 0; }
    python3 - "$work/d-00000-of-00002.tfrecord" <<'PY'
import gzip, struct, sys
def crc32c(b):
    c = 0xffffffff
    for x in b:
        c ^= x
        for _ in range(8):
            c = (c >> 1) ^ (0x82f63b78 & -(c & 1))
    return c ^ 0xffffffff
mask = lambda c: (((c >> 15) | (c << 17)) + 0xa282ead8) & 0xffffffff
data = gzip.open(sys.argv[1]).read()
n = struct.unpack('<Q', data[:8])[0]
ok = (struct.unpack('<I', data[8:12])[0] == mask(crc32c(data[:8])) and
      struct.unpack('<I', data[12 + n:16 + n])[0] == mask(crc32c(data[12:12 + n])) and len(data) == 16 + n and
      bytes(range(6)) in data[12:12 + n])
print("python gzip: shard 0 holds one record of %d bytes, CRCs %s" % (n, "ok" if ok else "BAD"))
PY
    echo "rc=$?"
    ;;
  corrupt)
    idx
    "$KILN" records from-idx --images "$work/images.idx" --labels "$work/labels.idx" --out "$work/d" >/dev/null
    f="$work/d-00000-of-00001.tfrecord"
    # Flip the last byte of the second of three equal-sized records (its data CRC).
    size=$(stat -c %s "$f")
    rec=$((size / 3))
    printf '\xff' | dd of="$f" bs=1 seek=$((2 * rec - 1)) conv=notrunc status=none
    "$KILN" records show "$f" --limit 0 2>&1
    echo "rc=$?"
    "$KILN" records show "$f" --limit 0 --skip-corrupt 2>&1
    echo "rc=$?"
    ;;
  missing)
    idx
    "$KILN" records from-idx --images "$work/nope.idx" --labels "$work/labels.idx" --out "$work/d" 2>&1
    echo "rc=$?"
    ;;
  fmnist)
    "$KILN" records fashion-mnist --out "$work/fm" --shards 2 --compression zlib || { echo "rc=$?"; exit 0; }
    "$KILN" records show "$work/fm/test-00001-of-00002.tfrecord" --limit 1
    echo "rc=$?"
    ;;
esac
