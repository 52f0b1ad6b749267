#!/usr/bin/env bash
# Release every idem module at one version (docs/releasing.md).
#
#   scripts/release.sh vX.Y.Z                 dry run: print the plan, change nothing
#   scripts/release.sh --apply vX.Y.Z         make the release commits and tags here
#   scripts/release.sh --apply --push vX.Y.Z  ... and push them to origin
#
# In the workspace every nested module requires its idem siblings at
# v0.0.0 with a replace to ../ (go.work ties them together); that cannot be
# fetched by anyone else. A release therefore:
#
#  1. tags the root module vX.Y.Z at HEAD;
#  2. for each released nested module, every module after the ones it
#     requires (scripts/modules.sh): requires its idem siblings at vX.Y.Z,
#     drops the replace lines, runs go mod tidy against the tags just made
#     (fetched from this repository, not from the network), checks that the
#     module builds and vets on its own (GOWORK=off), commits that go.mod
#     and go.sum, and tags the commit DIR/vX.Y.Z (sqlstore/vX.Y.Z);
#  3. builds a scratch module outside the repository that requires every
#     released module at vX.Y.Z, as a user's would.
#
# The commits are made in a temporary worktree on the branch release-vX.Y.Z,
# never on the current branch: main keeps v0.0.0 and its replace lines, so
# the workspace and scripts/test.sh work as before. The example service and
# the test-only modules are not released (idem_unreleased in modules.sh).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd -P)
# shellcheck source=modules.sh
source "$root/scripts/modules.sh"

if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then
	export PATH="/usr/local/go/bin:$PATH"
fi

apply=0
push=0
version=""
for arg in "$@"; do
	case "$arg" in
	--apply) apply=1 ;;
	--push) push=1 ;;
	-h | --help)
		sed -n '2,26p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	v*) version=$arg ;;
	*)
		echo "release.sh: unknown argument $arg (usage: scripts/release.sh [--apply [--push]] vX.Y.Z)" >&2
		exit 2
		;;
	esac
done
if ((push && !apply)); then
	echo "release.sh: --push needs --apply" >&2
	exit 2
fi
if [[ ! "$version" =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]]; then
	echo "release.sh: give the version as vMAJOR.MINOR.PATCH (got '${version}')" >&2
	exit 2
fi
if [[ ! "$version" =~ ^v[01]\. ]]; then
	echo "release.sh: $version is a major version above 1: the module paths would need a /vN suffix first" >&2
	exit 2
fi

mapfile -t released < <(idem_released)
base=$(git -C "$root" rev-parse HEAD)

tagname() {
	if [[ "$1" == "." ]]; then echo "$version"; else echo "$1/$version"; fi
}

problems=()
if [[ -n "$(git -C "$root" status --porcelain)" ]]; then
	problems+=("the work tree has uncommitted changes: commit or remove them")
fi
for dir in "${released[@]}"; do
	if git -C "$root" rev-parse -q --verify "refs/tags/$(tagname "$dir")" >/dev/null; then
		problems+=("tag $(tagname "$dir") exists already")
	fi
done
if git -C "$root" rev-parse -q --verify "refs/heads/release-$version" >/dev/null; then
	problems+=("branch release-$version exists already")
fi

echo "release $version of github.com/idemkit/idem from $(git -C "$root" rev-parse --short HEAD) ($(git -C "$root" rev-parse --abbrev-ref HEAD))"
echo
echo "plan:"
n=1
for dir in "${released[@]}"; do
	path=$(idem_path "$root/$dir")
	if [[ "$dir" == "." ]]; then
		echo "  $n. git tag $version $(git -C "$root" rev-parse --short HEAD)    # $path"
	else
		reqs=$(idem_requires "$root/$dir" | tr '\n' ' ')
		echo "  $n. $dir ($path):"
		for r in $reqs; do
			echo "       go mod edit -require=$r@$version -dropreplace=$r"
		done
		echo "       GOWORK=off go mod tidy && GOWORK=off go vet ./...   # siblings from the tags above"
		echo "       git commit -m 'release $version: $dir requires tagged idem modules' go.mod go.sum"
		echo "       git tag $dir/$version"
	fi
	n=$((n + 1))
done
echo "  $n. build a scratch module outside the repository that requires every module above at $version"
n=$((n + 1))
echo "  $n. git push origin release-$version $(for d in "${released[@]}"; do printf '%s ' "$(tagname "$d")"; done)$( ((push)) || echo '  (with --push)')"
echo
echo "not released (keep v0.0.0 and replace): ${idem_unreleased[*]}"

if ((${#problems[@]} > 0)); then
	echo
	printf 'release.sh: cannot release: %s\n' "${problems[@]}" >&2
	exit 1
fi
if ((!apply)); then
	echo
	echo "dry run: nothing changed. Run with --apply to make the commits and tags."
	exit 0
fi

# --------------------------------------------------------------------------
# apply

work=$(mktemp -d /tmp/idem-release.XXXXXX)
tagged=()
cleanup() {
	local rc=$?
	git -C "$root" worktree remove --force "$work/tree" >/dev/null 2>&1 || true
	chmod -R u+w "$work" 2>/dev/null || true
	rm -rf "$work"
	if ((rc != 0 && ${#tagged[@]} > 0)); then
		echo "release.sh: failed; removing the tags made: ${tagged[*]}" >&2
		git -C "$root" tag -d "${tagged[@]}" >/dev/null || true
		git -C "$root" branch -D "release-$version" >/dev/null 2>&1 || true
	fi
	exit "$rc"
}
trap cleanup EXIT

# The go command fetches github.com/idemkit/idem from this repository's
# tags (git's insteadOf), and every other module as usual, from the local
# module cache first. A module cache of its own keeps these locally made
# versions out of the user's.
gitdir=$(git -C "$root" rev-parse --path-format=absolute --git-common-dir)
cat >"$work/gitconfig" <<EOF
[include]
	path = ${GIT_CONFIG_GLOBAL:-$HOME/.gitconfig}
[url "file://$gitdir"]
	insteadOf = https://github.com/idemkit/idem
[protocol "file"]
	allow = always
EOF
cache=$(go env GOMODCACHE)/cache/download
export GIT_CONFIG_GLOBAL="$work/gitconfig"
export GOMODCACHE="$work/modcache"
export GOPROXY="file://$cache,$(go env GOPROXY)"
export GOPRIVATE=$idem_prefix
export GOFLAGS="-mod=mod"
export GOWORK=off

git -C "$root" worktree add -q -b "release-$version" "$work/tree" "$base"
tree="$work/tree"

for dir in "${released[@]}"; do
	if [[ "$dir" == "." ]]; then
		git -C "$root" tag -a -m "idem $version" "$version" "$base"
		tagged+=("$version")
		echo "tagged $version"
		continue
	fi
	args=()
	for r in $(idem_requires "$tree/$dir"); do
		args+=("-require=$r@$version" "-dropreplace=$r")
	done
	(
		cd "$tree/$dir"
		go mod edit "${args[@]}"
		go mod tidy
		go vet ./...
	)
	if grep -q '=>' "$tree/$dir/go.mod" && grep '=>' "$tree/$dir/go.mod" | grep -q "$idem_prefix"; then
		echo "release.sh: $dir/go.mod still replaces an idem module" >&2
		exit 1
	fi
	git -C "$tree" add "$dir/go.mod" "$dir/go.sum"
	git -C "$tree" commit -q -m "release $version: $dir requires tagged idem modules"
	git -C "$root" tag -a -m "idem $dir $version" "$dir/$version" "$(git -C "$tree" rev-parse HEAD)"
	tagged+=("$dir/$version")
	echo "tagged $dir/$version"
done

# A user's module: requires every released module at the version and
# imports each one's package, or, for a command (idemctl: package main),
# has it as a tool and builds it, as go install would.
consumer="$work/consumer"
mkdir -p "$consumer"
{
	echo "module example.com/idemconsumer"
	echo
	echo "go $(go env GOVERSION | sed -E 's/^go([0-9]+\.[0-9]+).*/\1/')"
} >"$consumer/go.mod"
# is_command DIR: the module in DIR is a command (its root package is main).
is_command() {
	grep -qs '^package main$' $(find "$1" -maxdepth 1 -name '*.go' ! -name '*_test.go')
}
tools=()
{
	echo "package main"
	echo
	echo "import ("
	for dir in "${released[@]}"; do
		path=$(idem_path "$tree/$dir")
		if [[ "$dir" == "." ]]; then path=$path/core; fi
		if is_command "$tree/$dir"; then continue; fi
		echo "	_ \"$path\""
	done
	echo ")"
	echo
	echo "func main() {}"
} >"$consumer/main.go"
(
	cd "$consumer"
	for dir in "${released[@]}"; do
		if is_command "$tree/$dir"; then
			go get -tool "$(idem_path "$tree/$dir")@$version"
			tools+=("$(idem_path "$tree/$dir")")
		else
			go get "$(idem_path "$tree/$dir")@$version"
		fi
	done
	go mod tidy
	go build ./...
	if ((${#tools[@]} > 0)); then
		go build -o "$consumer/bin/" "${tools[@]}"
	fi
)
echo "a module outside the repository builds with every released module at $version"

if ((push)); then
	git -C "$root" push origin "release-$version" "${tagged[@]}"
	echo "pushed release-$version ${tagged[*]}"
else
	echo
	echo "done, not pushed. To publish:"
	echo "  git push origin release-$version ${tagged[*]}"
	echo "To undo:"
	echo "  git tag -d ${tagged[*]} && git branch -D release-$version"
fi
tagged=() # keep them
