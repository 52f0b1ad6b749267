#!/usr/bin/env bash
# The outside-in check: each released module builds, as a user's program
# would build it, with the requirements its go.mod publishes.
#
#   scripts/outside-in.sh          (scripts/test.sh runs it)
#
# For each released module (scripts/modules.sh: every go.work module but
# the example service and the test-only modules), a scratch module in a
# temporary directory outside the repository, without go.work
# (GOWORK=off, GOFLAGS=-mod=mod):
#
#   - requires that module, with replace lines to the local directories of
#     the idem modules only (the root and its siblings: nothing else);
#   - has a main package importing every public package of the module,
#     and a tool line for each of its commands (package main: idemctl);
#   - go mod tidy, go build (a program: compiled and linked), and go build
#     of each command (linked: what go install of it builds);
#   - every third-party module the module's go.mod names is selected at the
#     version named there: a newer one would mean the module's published
#     requirements are not enough to build it (a go.mod not kept tidy).
#
# Third-party modules come from the module cache or the module proxy.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd -P)
# shellcheck source=modules.sh
source "$root/scripts/modules.sh"

if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then
	export PATH="/usr/local/go/bin:$PATH"
fi

scratch=$(mktemp -d "${TMPDIR:-/tmp}/idem-outside-in.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
case "$scratch/" in
"$root"/*)
	echo "outside-in.sh: the scratch directory $scratch is inside the repository" >&2
	exit 1
	;;
esac

export GOWORK=off
# -mod=mod in the scratch modules only: never let it touch the repository's
# go.mod files.
repo_goflags=${GOFLAGS:-}
scratch_goflags="${GOFLAGS:+$GOFLAGS }-mod=mod"

mapfile -t released < <(idem_released)
# Every idem module of the workspace, released or not, may be replaced.
declare -A dir_of=()
while read -r dir; do
	[[ -z "$dir" ]] && continue
	dir_of[$(idem_path "$root/$dir")]=$dir
done < <(idem_workspace_dirs)

failed=()
for dir in "${released[@]}"; do
	path=$(idem_path "$root/$dir")
	mod="$scratch/${dir//\//_}"
	[[ "$dir" == "." ]] && mod="$scratch/root"
	mkdir -p "$mod"

	# The module's public packages (not internal), and its commands.
	mapfile -t pkgs < <(cd "$root/$dir" && GOFLAGS=$repo_goflags go list -f '{{if ne .Name "main"}}{{.ImportPath}}{{end}}' ./... | grep -v '/internal/' | grep -v '^$' || true)
	mapfile -t cmds < <(cd "$root/$dir" && GOFLAGS=$repo_goflags go list -f '{{if eq .Name "main"}}{{.ImportPath}}{{end}}' ./... | grep -v '/internal/' | grep -v '^$' || true)
	if ((${#pkgs[@]} + ${#cmds[@]} == 0)); then
		echo "outside-in: $dir has no package to import and no command" >&2
		failed+=("$dir")
		continue
	fi

	{
		echo "module example.com/outsidein"
		echo
		echo "go $(awk '$1 == "go" { print $2; exit }' "$root/$dir/go.mod")"
		echo
		echo "require $path v0.0.0"
		echo
		# Replace lines to local directories, for the idem modules only.
		for p in "${!dir_of[@]}"; do
			echo "replace $p => $root/${dir_of[$p]}"
		done
		# Commands are tools of the scratch module (go get -tool).
		for c in "${cmds[@]+"${cmds[@]}"}"; do
			echo "tool $c"
		done
	} >"$mod/go.mod"
	{
		echo "// Command outsidein imports every public package of $path."
		echo "package main"
		echo
		if ((${#pkgs[@]} > 0)); then
			echo "import ("
			printf '\t_ "%s"\n' "${pkgs[@]}"
			echo ")"
			echo
		fi
		echo "func main() {}"
	} >"$mod/main.go"

	echo "=== outside-in: $path (${#pkgs[@]} packages, ${#cmds[@]} commands)"
	if ! (cd "$mod" && export GOFLAGS=$scratch_goflags && go mod tidy && go build ./... &&
		{ ((${#cmds[@]} == 0)) || go build -o "$mod/bin/" "${cmds[@]}"; }); then
		failed+=("$dir")
		continue
	fi

	# The versions the scratch module selected against the ones the
	# module's go.mod names.
	declare -A selected=()
	while read -r p v; do
		selected[$p]=$v
	done < <(cd "$mod" && GOFLAGS=$scratch_goflags go list -m -f '{{.Path}} {{.Version}}' all)
	bad=0
	while read -r p v; do
		[[ "$p" == "$idem_prefix" || "$p" == "$idem_prefix"/* ]] && continue
		if [[ -n "${selected[$p]:-}" && "${selected[$p]}" != "$v" ]]; then
			echo "outside-in: $dir/go.mod requires $p $v, but a build of it selects ${selected[$p]}: run go mod tidy in $dir" >&2
			bad=1
		fi
	done < <(cd "$root/$dir" && GOFLAGS=$repo_goflags go mod edit -print | sed -E 's/^[[:space:]]*require[[:space:]]+//' |
		awk '$0 !~ /=>/ && $1 !~ /^(module|replace|go|toolchain|require|\)|\/\/)/ && NF >= 2 && $2 ~ /^v/ { print $1, $2 }')
	unset selected
	if ((bad)); then
		failed+=("$dir")
	fi
done

if ((${#failed[@]} > 0)); then
	echo "outside-in: FAIL: ${failed[*]}" >&2
	exit 1
fi
echo "outside-in: ok (${#released[@]} modules: ${released[*]})"
