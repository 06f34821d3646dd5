#!/usr/bin/env bash
# check_layers.sh — checks that ember's dependencies point one way. Each
# top-level folder is a layer; a file may include headers of its own layer
# and of the layers below it, never of one above (docs/ARCHITECTURE.md,
# "Layers"; ../shared/DESIGN.md). Low to high:
#
#     tensor  autograd  nn  optim  data  amp  dist  tools
#
# The public headers count as the layer they describe (include/ember/X.h is
# layer X; runtime.h and profile.h are tensor's; ember.h, which includes them all, and
# tracker.h, which dist/ implements, are dist's).
# examples/ is not a layer: it may include only the public headers.
#
# Every `#include "..."` (and `<ember/...>`) in *.c *.h *.cu *.cuh of those
# folders is resolved the way the build resolves it (the including file's
# folder first, then the source root and include/); a header the build
# generates (ember_config.h) or a system header belongs to no layer.
#
# Upward includes that exist today are listed in scripts/check_layers.known
# (file, header, what removes it). Such an include is tolerated and printed as
# known; any other upward include fails the check, and so does a listed one
# that no longer exists (delete its line: the list only shrinks).
#
# Prints which folder includes which, then the violations; exit 0 when the
# tree is as the rule and the list say, 1 when not, 2 on a usage error.
#
# usage: scripts/check_layers.sh [ROOT [KNOWN]]
#   ROOT   source tree (default: the tree holding this script)
#   KNOWN  list of tolerated includes (default ROOT/scripts/check_layers.known)
# Run by the test suite (tests/test_surface.c); needs bash and grep only.
set -uo pipefail

root=${1:-"$(cd "$(dirname "$0")/.." && pwd)"}
known_file=${2:-"$root/scripts/check_layers.known"}
if [ ! -d "$root/tensor" ] || [ ! -d "$root/include/ember" ]; then
    echo "check_layers: $root is not an ember source tree (no tensor/ or include/ember/)" >&2
    exit 2
fi
if [ ! -f "$known_file" ]; then
    echo "check_layers: no list of known violations at $known_file" >&2
    exit 2
fi

layers=(tensor autograd nn optim data amp dist tools)
declare -A rank=()
for i in "${!layers[@]}"; do rank[${layers[$i]}]=$i; done

# The helpers below answer in $REPLY (no subshell per include: the check
# runs in the test suite and must stay fast).

# layer_of_public NAME.h -> the layer a public header belongs to ('' if none)
layer_of_public() {
    REPLY=
    case $1 in
    runtime.h | profile.h) REPLY=tensor ;;
    ember.h | tracker.h) REPLY=dist ;;
    *) [ -n "${rank[${1%.h}]+x}" ] && REPLY=${1%.h} ;;
    esac
}

# normalize PATH -> PATH with . and .. segments resolved (no leading /)
normalize() {
    local IFS=/ part out=()
    for part in $1; do
        case $part in
        '' | .) ;;
        ..) [ ${#out[@]} -gt 0 ] && unset 'out[${#out[@]}-1]' ;;
        *) out+=("$part") ;;
        esac
    done
    REPLY="${out[*]}"
}

# resolve DIR HEADER -> the header's path under ROOT, or '' when it is not
# one of ember's source headers (system, generated)
resolve() {
    local p
    for p in "$1/$2" "$2" "include/$2"; do
        normalize "$p"
        [ -f "$root/$REPLY" ] && return
    done
    REPLY=
}

# layer_of PATH (under ROOT) -> its layer, 'examples', or ''
layer_of() {
    REPLY=
    case $1 in
    include/ember/*) layer_of_public "${1#include/ember/}" ;;
    examples/*) REPLY=examples ;;
    *) [ -n "${rank[${1%%/*}]+x}" ] && REPLY=${1%%/*} ;;
    esac
}

# ---- the known list: "FILE HEADER what removes it" per line, # comments ----
declare -A known=() known_seen=()
while read -r f h why; do
    case $f in '' | \#*) continue ;; esac
    known["$f -> $h"]=$why
done <"$known_file"

# ---- every include in the layer folders, the public headers and examples ----
cd "$root" || exit 2
files=()
for d in "${layers[@]}" include/ember examples; do
    [ -d "$d" ] || continue
    while IFS= read -r f; do files+=("$f"); done < <(find "$d" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
done

declare -A edges=()
new=() tolerated=() nfiles=${#files[@]} ncross=0
while IFS= read -r line; do
    file=${line%%:*}
    rest=${line#*:}
    rest=${rest#*:} # the line number
    if [[ $rest =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\"([^\"]+)\" ]]; then
        hdr=${BASH_REMATCH[1]}
    elif [[ $rest =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\<(ember/[^\>]+)\> ]]; then
        hdr=${BASH_REMATCH[1]}
    else
        continue
    fi
    resolve "${file%/*}" "$hdr"
    target=$REPLY
    [ -n "$target" ] || continue
    layer_of "$file"
    from=$REPLY
    layer_of "$target"
    to=$REPLY
    [ -n "$from" ] && [ -n "$to" ] && [ "$from" != "$to" ] || continue
    ncross=$((ncross + 1))
    edges[$from]+=" $to"
    if [ "$from" = examples ]; then
        [[ $target == include/ember/* ]] && continue
        new+=("$file -> $target (examples use the public API only: include/ember/)")
        continue
    fi
    [ "${rank[$to]}" -gt "${rank[$from]}" ] || continue
    key="$file -> $target"
    if [ -n "${known[$key]+x}" ]; then
        known_seen[$key]=1
        tolerated+=("$key ($from reaches up to $to; known, to be removed by ${known[$key]})")
    else
        below=${layers[*]:0:${rank[$from]}+1}
        new+=("$key ($from reaches up to $to; $from may include only: ${below// /, })")
    fi
done < <(grep -HnE '^[[:space:]]*#[[:space:]]*include' "${files[@]}")

stale=()
for key in "${!known[@]}"; do
    [ -n "${known_seen[$key]+x}" ] || stale+=("$key")
done

# ---- report ----
echo "check_layers: layers, low to high: ${layers[*]}"
for l in "${layers[@]}" examples; do
    if [ -z "${edges[$l]+x}" ]; then
        [ "$l" = examples ] || printf '  %-9s includes only itself\n' "$l"
        continue
    fi
    out=""
    for t in "${layers[@]}"; do
        case " ${edges[$l]} " in *" $t "*)
            if [ "$l" != examples ] && [ "${rank[$t]}" -gt "${rank[$l]}" ]; then out+=" $t(UP)"; else out+=" $t"; fi ;;
        esac
    done
    printf '  %-9s includes%s\n' "$l" "$out"
done
for t in "${tolerated[@]}"; do echo "known: $t"; done
status=0
for n in "${new[@]}"; do
    echo "NEW upward include: $n"
    status=1
done
for s in "${stale[@]}"; do
    echo "STALE entry in ${known_file#"$root"/}: $s no longer exists; delete the line (the list only shrinks)"
    status=1
done
if [ $status -eq 0 ]; then
    echo "check_layers: OK ($nfiles files, $ncross includes across folders, ${#tolerated[@]} known upward)"
else
    echo "check_layers: FAILED (${#new[@]} new upward, ${#stale[@]} stale known)"
fi
exit $status
