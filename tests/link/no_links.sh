#!/bin/sh
# no_links.sh EXECUTABLE ARCHIVE... - fail when EXECUTABLE holds code of any ARCHIVE, or needs
# the CUDA runtime.
#
# Holds code: EXECUTABLE defines a global symbol that one of the static libraries ARCHIVE...
# defines (nm -g --defined-only; static inline functions and other local symbols do not count).
# Needs the CUDA runtime: a DT_NEEDED entry libcudart* (readelf -d), or a defined global cuda*
# symbol (a static cudart). Used by ctest router_links: tandem-router must not link
# tandem_engine, tandem_kernels or cudart (docs/ARCHITECTURE.md section 1).
# Exit status: 0 clean, 1 a forbidden symbol or library found (each is printed), 2 usage or a
# tool failed (an empty symbol list is a failure, so a missing nm cannot pass the check).
set -u
if [ $# -lt 2 ]; then
    echo "usage: $0 EXECUTABLE ARCHIVE..." >&2
    exit 2
fi
exe=$1
shift
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT

nm -g --defined-only "$exe" 2>/dev/null | awk 'NF == 3 { print $3 }' | sort -u >"$tmp/exe"
if [ ! -s "$tmp/exe" ]; then
    echo "no_links: no global symbols read from $exe" >&2
    exit 2
fi
status=0
for archive in "$@"; do
    nm -g --defined-only "$archive" 2>/dev/null | awk 'NF == 3 { print $3 }' | sort -u \
        >"$tmp/lib"
    if [ ! -s "$tmp/lib" ]; then
        echo "no_links: no global symbols read from $archive" >&2
        exit 2
    fi
    comm -12 "$tmp/exe" "$tmp/lib" >"$tmp/both"
    if [ -s "$tmp/both" ]; then
        echo "no_links: $exe holds $(wc -l <"$tmp/both") symbols of $archive, e.g.:"
        head -5 "$tmp/both"
        status=1
    fi
done
if readelf -d "$exe" | grep -q 'NEEDED.*libcudart'; then
    echo "no_links: $exe needs the CUDA runtime:"
    readelf -d "$exe" | grep 'NEEDED.*libcudart'
    status=1
fi
if grep -q '^cuda' "$tmp/exe"; then
    echo "no_links: $exe defines CUDA runtime symbols, e.g.:"
    grep '^cuda' "$tmp/exe" | head -5
    status=1
fi
if [ $status -eq 0 ]; then
    echo "no_links: $exe holds none of $* and no cudart"
fi
exit $status
