#!/usr/bin/env bash
# test/gpu/pack_citus.sh — puts Citus, as built and installed on the
# development machine (../shared/vendor/build.sh citus), into the kit folder
# that travels to the GPU machine, for test/gpu/citus.sh:
#   KIT/citus/lib        citus*.so (stripped) and citus_decoders/
#   KIT/citus/extension  citus*.control and citus*.sql
#   KIT/citus/deps       the shared libraries citus.so needs beyond the C
#                        library family and those KIT/pgkit.tar.xz already
#                        carries (libcurl, libzstd, ...), as pgkit.sh
#                        carries PostgreSQL's
#
#   bash test/gpu/pack_citus.sh KIT [PG_CONFIG]
# PG_CONFIG names the PostgreSQL 15 installation Citus was installed into
# (default: pg_config on PATH); it must be the PostgreSQL the kit carries
# (the same 15.x build).
set -eu
KIT=${1:?usage: pack_citus.sh KIT [PG_CONFIG]}
PG_CONFIG=${2:-${PG_CONFIG:-pg_config}}
lib=$("$PG_CONFIG" --pkglibdir)
share=$("$PG_CONFIG" --sharedir)/extension
[ -f "$lib/citus.so" ] || { echo "error: no citus.so in $lib (build it: ../shared/vendor/build.sh citus)" >&2; exit 1; }
rm -rf "$KIT/citus"
mkdir -p "$KIT/citus/lib" "$KIT/citus/extension" "$KIT/citus/deps"
cp "$lib"/citus*.so "$KIT/citus/lib/"
[ -d "$lib/citus_decoders" ] && cp -r "$lib/citus_decoders" "$KIT/citus/lib/"
strip --strip-unneeded "$KIT/citus/lib"/*.so 2>/dev/null || true
cp "$share"/citus*.control "$share"/citus*.sql "$KIT/citus/extension/"
# (those the kit's PostgreSQL already carries stay out)
carried=$(tar -tJf "$KIT/pgkit.tar.xz" 2>/dev/null | sed -n 's|^\./opt/pgkit/lib/||p')
ldd "$lib/citus.so" | awk '/=>/ { print $3 }' |
	grep -Ev '/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so' |
	while read -r dep; do
		grep -qxF "$(basename "$dep")" <<< "$carried" || cp -L "$dep" "$KIT/citus/deps/"
	done
du -sh "$KIT/citus"
