#!/usr/bin/env bash
# The outside-in check: each published module, got at a release's version
# through a module proxy, builds as a user's program would build it, with
# the requirements its go.mod publishes, and the README's quick starts
# build against all of them.
#
#   scripts/outside-in.sh REPO      (scripts/release.sh runs it, for a
#                                    rehearsal and for every release)
#
# REPO is the release's repository at the release commit. The environment
# names the version (IDEM_RELEASE_VERSION) and the module proxy that has
# it (GOPROXY=file://...,<the usual proxy>, GONOSUMDB for idem's modules):
# release.sh sets both. In temporary directories outside the repository,
# without go.work (GOWORK=off, GOFLAGS=-mod=mod) and without replace lines:
#
#   - per published module, a scratch module that runs go get for it at
#     the version, imports every public package of it in a main package,
#     and go get -tool for each of its commands (idemctl: what go install
#     builds); go mod tidy, go build (compiled and linked), go build of
#     each command;
#   - every third-party module the published go.mod names is selected at
#     the version named there: a newer one would mean the module's
#     published requirements are not enough to build it (a go.mod not kept
#     tidy); every idem module is selected at the release's version;
#   - one more module, scripts/quickstart (the README's quick starts made
#     whole), gets every published library module at the version and
#     builds.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
root=$(cd "${1:?usage: scripts/outside-in.sh REPO (run by scripts/release.sh)}" && pwd -P)
version=${IDEM_RELEASE_VERSION:?IDEM_RELEASE_VERSION is not set: scripts/release.sh --rehearse runs this check}
# shellcheck source=modules.sh
source "$here/scripts/modules.sh"

if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then
	export PATH="/usr/local/go/bin:$PATH"
fi
case "${GOPROXY:-}" in
file://*) ;;
*)
	echo "outside-in.sh: GOPROXY must name the release's module proxy first (file://...): run scripts/release.sh --rehearse" >&2
	exit 2
	;;
esac

scratch=$(mktemp -d "${TMPDIR:-/tmp}/idem-outside-in.XXXXXX")
trap 'chmod -R u+w "$scratch" 2>/dev/null; rm -rf "$scratch"' EXIT
for d in "$here" "$root"; do
	case "$scratch/" in
	"$d"/*)
		echo "outside-in.sh: the scratch directory $scratch is inside the repository $d" >&2
		exit 1
		;;
	esac
done

export GOWORK=off
user_goflags=${GOFLAGS:-}
user_goflags=${user_goflags//-mod=mod/}
user_goflags=${user_goflags//-mod=readonly/}
scratch_goflags="${user_goflags:+$user_goflags }-mod=mod"
repo_goflags="${user_goflags:+$user_goflags }-mod=readonly"

mapfile -t released < <(idem_released)

# idem_at_version DIR: every idem module the scratch module in DIR selects
# is at $version.
idem_at_version() {
	local bad
	bad=$(cd "$1" && GOFLAGS=$scratch_goflags go list -m -f '{{.Path}} {{.Version}}' all |
		awk -v p="$idem_prefix" -v v="$version" '($1 == p || index($1, p "/") == 1) && $2 != v')
	if [[ -n "$bad" ]]; then
		echo "outside-in: $2 selects idem modules at other versions than $version:" >&2
		sed 's/^/    /' <<<"$bad" >&2
		return 1
	fi
}

goline() { awk '$1 == "go" { print $2; exit }' "$1"; }

failed=()
libs=()
quickstarts=0
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
	((${#pkgs[@]} > 0)) && libs+=("$path")

	printf 'module example.com/outsidein\n\ngo %s\n' "$(goline "$root/$dir/go.mod")" >"$mod/go.mod"
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

	echo "outside-in: go get $path@$version (${#pkgs[@]} packages, ${#cmds[@]} commands)"
	if ! (cd "$mod" && export GOFLAGS=$scratch_goflags &&
		{ ((${#pkgs[@]} == 0)) || go get "$path@$version"; } &&
		for c in "${cmds[@]+"${cmds[@]}"}"; do go get -tool "$c@$version" || exit 1; done &&
		go mod tidy && go build ./... &&
		{ ((${#cmds[@]} == 0)) || go build -o "$mod/bin/" "${cmds[@]}"; }) >"$mod.log" 2>&1; then
		cat "$mod.log" >&2
		failed+=("$dir")
		continue
	fi
	if grep -q '^replace\|=>' "$mod/go.mod"; then
		echo "outside-in: the scratch module for $dir has a replace line" >&2
		failed+=("$dir")
		continue
	fi
	idem_at_version "$mod" "$dir" || {
		failed+=("$dir")
		continue
	}

	# The versions the scratch module selected against the ones the
	# module's go.mod names.
	declare -A selected=()
	while read -r p v; do
		selected[$p]=$v
	done < <(cd "$mod" && GOFLAGS=$scratch_goflags go list -m -f '{{.Path}} {{.Version}}' all)
	bad=0
	while read -r p v; do
		idem_is_idem "$p" && continue
		if [[ -n "${selected[$p]:-}" && "${selected[$p]}" != "$v" ]]; then
			echo "outside-in: $dir/go.mod requires $p $v, but a build of it selects ${selected[$p]}: run go mod tidy in $dir" >&2
			bad=1
		fi
	done < <(_idem_directive "$root/$dir/go.mod" require | awk 'NF >= 2 { print $1, $2 }')
	unset selected
	if ((bad)); then
		failed+=("$dir")
	fi
done

# The README's quick starts, in one module that gets every published
# library module, as a new user following the README would.
qs="$root/scripts/quickstart"
if [[ -d "$qs" ]]; then
	echo "outside-in: the README's quick starts (scripts/quickstart), with go get of ${#libs[@]} modules at $version"
	mkdir -p "$scratch/quickstart"
	cp -R "$qs/." "$scratch/quickstart/"
	gets=()
	for p in "${libs[@]}"; do gets+=("$p@$version"); done
	if (cd "$scratch/quickstart" && export GOFLAGS=$scratch_goflags &&
		go get "${gets[@]}" && go mod tidy && go build ./... && go vet ./...) >"$scratch/quickstart.log" 2>&1; then
		idem_at_version "$scratch/quickstart" quickstart || failed+=("quickstart")
		quickstarts=$(cd "$scratch/quickstart" && GOFLAGS=$scratch_goflags go list -f '{{if eq .Name "main"}}{{.ImportPath}}{{end}}' ./... | grep -c . || true)
	else
		cat "$scratch/quickstart.log" >&2
		failed+=("quickstart")
	fi
else
	echo "outside-in: $qs is missing: the README's quick starts are not built" >&2
	failed+=("quickstart")
fi

# The documentation's go get and go install lines name modules the checks
# above got: every idem path in them is a published module's.
declare -A published=()
for dir in "${released[@]}"; do
	published[$(idem_path "$root/$dir")]=1
done
while IFS=: read -r file line; do
	for word in $line; do
		p=${word%%@*}
		p=${p%%[\`\)\"\']*}
		idem_is_idem "$p" || continue
		if [[ -z "${published[$p]:-}" ]]; then
			echo "outside-in: ${file#"$root"/} says go get or go install $p, which is not a published module" >&2
			failed+=("docs")
		fi
	done
done < <(grep -roE --include='*.md' 'go (get|install)( -[a-z]+)* [^`|]*' "$root" || true)

if ((${#failed[@]} > 0)); then
	echo "outside-in: FAIL: ${failed[*]}" >&2
	exit 1
fi
echo "outside-in: ok (${#released[@]} modules got at $version through the proxy, each built by a scratch module of its own; $quickstarts quick starts built against all of them)"
