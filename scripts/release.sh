#!/usr/bin/env bash
# Release every published idem module at one version (docs/releasing.md).
#
#   scripts/release.sh vX.Y.Z                 dry run: check the modules, print the plan
#   scripts/release.sh --rehearse             the whole release on a copy of the work
#                                             tree, at a version no one will see
#                                             (scripts/test.sh runs it)
#   scripts/release.sh --tidy                 fix what a script can of the rules (idem
#                                             replace lines, versions, go.work), then
#                                             go mod tidy every module on its own (as a
#                                             rehearsal does) and write the result back
#   scripts/release.sh --apply vX.Y.Z         make the release commit and tags here
#   scripts/release.sh --apply --push vX.Y.Z  ... and push them to origin
#
# A release, rehearsed or not, is made in a throwaway git repository in a
# temporary directory (a copy of the work tree for --rehearse, a clone of
# HEAD for --apply):
#
#  1. every go.mod requires its idem siblings at the version, and go.work's
#     replace lines name it; the root module is tagged;
#  2. each published module, every one after the ones it requires: go mod
#     tidy on its own (GOWORK=off) fills its go.sum from the tags made so
#     far, then it is tagged DIR/VERSION; then the unpublished modules are
#     tidied the same way; a go.mod or go.sum that tidy changes beyond
#     idem's own lines is an error (main's must be tidy already);
#  3. all of it becomes one commit, and every tag is moved onto it;
#  4. a module proxy in a temporary directory: the go command downloads
#     each published module at the version from the tags (as the public
#     proxy would from GitHub), and each must hash as in step 2;
#  5. every module of go.work vets on its own (GOWORK=off go vet ./...,
#     tests included) with its idem requirements from that proxy;
#  6. outside the repository, with the proxy (GOPROXY=file://...) in front
#     of the usual one and no replace line: a scratch module per published
#     module gets it and builds every package and command of it
#     (scripts/outside-in.sh), and one module gets all of them and builds
#     the README's quick starts (scripts/quickstart).
#
# --apply then copies the commit (branch release-VERSION) and the tags into
# this repository; --push pushes them. --rehearse removes everything it made.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
src=$(pwd -P)
root=$src
# shellcheck source=modules.sh
source "$src/scripts/modules.sh"

if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then
	export PATH="/usr/local/go/bin:$PATH"
fi

apply=0
push=0
rehearse=0
tidy_back=0
version=""
for arg in "$@"; do
	case "$arg" in
	--apply) apply=1 ;;
	--push) push=1 ;;
	--rehearse) rehearse=1 ;;
	--tidy) rehearse=1 tidy_back=1 ;;
	-h | --help)
		awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
		exit 0
		;;
	v*) version=$arg ;;
	*)
		echo "release.sh: unknown argument $arg (usage: scripts/release.sh [--rehearse | [--apply [--push]] vX.Y.Z])" >&2
		exit 2
		;;
	esac
done
if ((push && !apply)); then
	echo "release.sh: --push needs --apply" >&2
	exit 2
fi
if ((rehearse && apply)); then
	echo "release.sh: --rehearse and --apply exclude each other" >&2
	exit 2
fi
if ((rehearse)); then
	if [[ -n "$version" ]]; then
		echo "release.sh: --rehearse picks its own version (v0.0.0-rehearsal...)" >&2
		exit 2
	fi
	# Unique, so that no module cache can hold an older copy under this name.
	version="v0.0.0-rehearsal.$(date -u +%Y%m%d%H%M%S).$$"
fi
if [[ ! "$version" =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]]; then
	echo "release.sh: give the version as vMAJOR.MINOR.PATCH (got '${version}')" >&2
	exit 2
fi
if [[ ! "$version" =~ ^v[01]\. ]]; then
	echo "release.sh: $version is a major version above 1: the module paths would need a /vN suffix first" >&2
	exit 2
fi

say() { printf 'release: %s\n' "$*"; }

if ((tidy_back)); then
	idem_fix
fi
if ! idem_check; then
	echo "release.sh: the modules break the rules above (docs/releasing.md)" >&2
	exit 1
fi
mapfile -t released < <(idem_released)
mapfile -t unpublished < <(idem_unpublished)
mapfile -t workspace < <(idem_workspace_dirs)

tagname() {
	if [[ "$1" == "." ]]; then echo "$version"; else echo "$1/$version"; fi
}

# --------------------------------------------------------------------------
# the plan

if ((!rehearse)); then
	problems=()
	if [[ -n "$(git -C "$src" status --porcelain)" ]]; then
		problems+=("the work tree has uncommitted changes: commit or remove them")
	fi
	for dir in "${released[@]}"; do
		if git -C "$src" rev-parse -q --verify "refs/tags/$(tagname "$dir")" >/dev/null; then
			problems+=("tag $(tagname "$dir") exists already")
		fi
	done
	if git -C "$src" rev-parse -q --verify "refs/heads/release-$version" >/dev/null; then
		problems+=("branch release-$version exists already")
	fi

	echo "release $version of $idem_prefix from $(git -C "$src" rev-parse --short HEAD) ($(git -C "$src" rev-parse --abbrev-ref HEAD))"
	echo
	echo "published, tagged in this order (each after the idem modules it requires):"
	for dir in "${released[@]}"; do
		printf '  %-28s %s\n' "$(tagname "$dir")" "$(idem_path "$src/$dir")"
	done
	echo "not published, never tagged: ${unpublished[*]}"
	echo
	echo "every go.mod requires its idem siblings at $version (today: $(idem_version)), go mod tidy"
	echo "fills the go.sum files, and one commit on the branch release-$version carries all"
	echo "the tags; each module is then fetched through a module proxy made from the tags,"
	echo "vetted on its own and built from scratch modules outside the repository."
	if ((push)); then
		echo "then: git push origin release-$version and the tags"
	fi
	if ((${#problems[@]} > 0)); then
		echo
		printf 'release.sh: cannot release: %s\n' "${problems[@]}" >&2
		exit 1
	fi
	if ((!apply)); then
		echo
		echo "dry run: nothing changed. Rehearse it with --rehearse, make it with --apply."
		exit 0
	fi
fi

# --------------------------------------------------------------------------
# the throwaway repository

t_start=$(date +%s)
default_proxy=$(go env GOPROXY)
modcache=$(go env GOMODCACHE)
user_goflags=$(go env GOFLAGS)
work=$(mktemp -d "${TMPDIR:-/tmp}/idem-release.XXXXXX")
case "$work/" in
"$src"/*)
	echo "release.sh: the temporary directory $work is inside the repository" >&2
	exit 1
	;;
esac
repo="$work/repo"

# forget_version removes what the go command stored of the idem modules at
# $version in the usual module cache (the scratch modules use that cache,
# for the third-party modules already there and their compiled packages).
forget_version() {
	local d
	[[ -d "$modcache/github.com/idemkit" || -d "$modcache/cache/download/github.com/idemkit" ]] || return 0
	while read -r d; do
		chmod -R u+w "$d" 2>/dev/null || true
		rm -rf "$d"
	done < <(find "$modcache/github.com/idemkit" -maxdepth 3 -type d -name "*@$version" 2>/dev/null)
	find "$modcache/cache/download/github.com/idemkit" -path "*/@v/$version.*" -exec rm -f {} + 2>/dev/null || true
	while read -r d; do
		grep -vxF "$version" "$d" >"$d.tmp" || true
		mv "$d.tmp" "$d"
	done < <(find "$modcache/cache/download/github.com/idemkit" -path '*/@v/list' 2>/dev/null)
	# and what is left empty
	find "$modcache/cache/download/github.com/idemkit" "$modcache/github.com/idemkit" -depth -empty -delete 2>/dev/null || true
}
cleanup() {
	local rc=$?
	forget_version
	chmod -R u+w "$work" 2>/dev/null || true
	rm -rf "$work"
	exit "$rc"
}
trap cleanup EXIT

# Commits and tags of the throwaway repository: the user's identity for a
# release, a fixed one for a rehearsal (a fresh CI machine has none).
if ((rehearse)); then
	export GIT_AUTHOR_NAME="idem release rehearsal" GIT_AUTHOR_EMAIL="rehearsal@invalid"
else
	GIT_AUTHOR_NAME=$(git -C "$src" config user.name || echo "idem release")
	GIT_AUTHOR_EMAIL=$(git -C "$src" config user.email || echo "release@invalid")
	export GIT_AUTHOR_NAME GIT_AUTHOR_EMAIL
fi
export GIT_COMMITTER_NAME=$GIT_AUTHOR_NAME GIT_COMMITTER_EMAIL=$GIT_AUTHOR_EMAIL

if ((rehearse)); then
	# The work tree as it is, committed or not: tracked and untracked files
	# that are not ignored, as scripts/test.sh's gofmt step sees them.
	mkdir -p "$repo"
	git -C "$repo" init -q
	if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
		(cd "$src" && git ls-files -z --cached --others --exclude-standard |
			while IFS= read -r -d '' f; do [[ -e "$f" ]] && printf '%s\0' "$f"; done |
			tar --null -T - -cf -) | tar -C "$repo" -xf -
	else
		(cd "$src" && tar --exclude=.git -cf - .) | tar -C "$repo" -xf -
	fi
	git -C "$repo" add -A
	git -C "$repo" commit -q -m "the work tree to rehearse the release of"
	say "rehearsing $version on a copy of the work tree, in $work"
else
	git clone -q --no-checkout "$src" "$repo"
	git -C "$repo" checkout -q --detach "$(git -C "$src" rev-parse HEAD)"
	say "releasing $version from $(git -C "$src" rev-parse --short HEAD), in $work"
fi
base=$(git -C "$repo" rev-parse HEAD)
root=$repo

# The go command, two ways. go_fetch downloads a module at a tag of the
# throwaway repository, as the public proxy would fetch it from GitHub (the
# same code makes the zip), into the module cache $fetchcache: its
# cache/download directory is a module proxy. go_user runs as a user
# outside the repository: no go.work, that proxy first, then the usual
# one, no checksum database for idem's modules (the proxy's versions are in
# none).
cat >"$work/gitconfig" <<EOF
[url "file://$repo"]
	insteadOf = https://$idem_prefix
[protocol "file"]
	allow = always
[safe]
	directory = *
EOF
mkdir -p "$work/empty"
fetchcache="$work/fetch1"
proxy="$work/fetch1/cache/download"
go_fetch() {
	(cd "$work/empty" && env GOWORK=off GOFLAGS= GOMODCACHE="$fetchcache" GOPROXY=direct \
		GOPRIVATE="$idem_prefix" GONOSUMDB= GONOPROXY= GIT_CONFIG_GLOBAL="$work/gitconfig" GIT_CONFIG_NOSYSTEM=1 \
		go mod download -json "$@" >"$work/download.json") || {
		cat "$work/download.json" >&2
		return 1
	}
}
# quiet CMD...: run CMD, showing its output only if it fails.
quiet() {
	local rc=0
	"$@" >"$work/out.log" 2>&1 || rc=$?
	((rc == 0)) || cat "$work/out.log" >&2
	return "$rc"
}
go_user() {
	local mode=$1
	shift
	env GOWORK=off GOFLAGS="${user_goflags:+$user_goflags }-mod=$mode" \
		GOPROXY="file://$proxy,$default_proxy" GONOSUMDB="$idem_prefix${GONOSUMDB:+,$GONOSUMDB}" GOPRIVATE= GONOPROXY= \
		go "$@"
}

# --------------------------------------------------------------------------
# 1. requirements at the version, the root's tag

old=$(idem_version)
for dir in "${workspace[@]}"; do
	args=()
	for r in $(idem_requires "$repo/$dir"); do
		args+=("-require=$r@$version")
	done
	if ((${#args[@]} > 0)); then
		(cd "$repo/$dir" && go mod edit "${args[@]}")
	fi
done
# go.work's replace lines, in place (go work edit would drop the comment
# and the block).
sed -E -i "s#^([[:space:]]*(replace[[:space:]]+)?$idem_prefix[^[:space:]]*[[:space:]]+)$old([[:space:]]+=>)#\1$version\3#" "$repo/go.work"
if ! idem_check; then
	echo "release.sh: the modules at $version break the rules above" >&2
	exit 1
fi
git -C "$repo" add -A
git -C "$repo" commit -q -m "release $version: the idem modules require each other at $version"

tag() { # tag DIR: tag module DIR at HEAD and fetch it
	local t
	t=$(tagname "$1")
	git -C "$repo" tag -a -m "idem $(idem_path "$repo/$1") $version" "$t"
	go_fetch "$(idem_path "$repo/$1")@$version"
}
tag .

# --------------------------------------------------------------------------
# 2. tidy and tag, in order

problems=()
tidied=()
# drift DIR: what go mod tidy changed in DIR beyond idem's own lines.
drift() {
	local d=$1 diffs sums
	diffs=$(diff <(sed -E "s#^([[:space:]]*(require[[:space:]]+)?$idem_prefix[^[:space:]]*[[:space:]]+)$old#\1$version#" "$src/$d/go.mod") "$repo/$d/go.mod" | sed 's/^/go.mod: /' || true)
	if [[ -f "$src/$d/go.sum" || -f "$repo/$d/go.sum" ]]; then
		sums=$(diff <(grep -v "^$idem_prefix[/ ]" "$src/$d/go.sum" 2>/dev/null || true) \
			<(grep -v "^$idem_prefix[/ ]" "$repo/$d/go.sum" 2>/dev/null || true) | sed 's/^/go.sum: /' || true)
		diffs+=${diffs:+${sums:+$'\n'}}$sums
	fi
	if [[ -n "$diffs" ]] && ((tidy_back)); then
		# Back to the work tree, with idem's own lines as they were there.
		sed -E "s#^([[:space:]]*(require[[:space:]]+)?$idem_prefix[^[:space:]]*[[:space:]]+)$version#\1$old#" "$repo/$d/go.mod" >"$src/$d/go.mod"
		if [[ -f "$repo/$d/go.sum" ]]; then
			# go's order: src's idem lines where they sort among the others.
			grep "^$idem_prefix[/ ]" "$src/$d/go.sum" >"$work/idem.sum" 2>/dev/null || true
			grep -v "^$idem_prefix[/ ]" "$repo/$d/go.sum" |
				LC_ALL=C awk -v p="$idem_prefix" -v f="$work/idem.sum" '
					!done && $1 > p { while ((getline l < f) > 0) print l; done = 1 }
					{ print }
					END { if (!done) while ((getline l < f) > 0) print l }
				' >"$src/$d/go.sum"
		fi
		tidied+=("$d")
	elif [[ -n "$diffs" ]]; then
		problems+=("$d/go.mod or go.sum is not tidy for the module on its own: GOWORK=off go mod tidy there changes
$(sed 's/^/    /' <<<"$diffs")")
	fi
}
tidy() { # tidy DIR
	(cd "$repo/$1" && quiet go_user mod mod tidy) || {
		problems+=("GOWORK=off go mod tidy fails in $1")
		return 0
	}
	drift "$1"
	if [[ -n "$(git -C "$repo" status --porcelain -- "$1")" ]]; then
		git -C "$repo" add -A -- "$1"
		git -C "$repo" commit -q -m "release $version: $1's go.sum"
	fi
}
for dir in "${released[@]}"; do
	[[ "$dir" == "." ]] && continue
	tidy "$dir"
	tag "$dir"
done
for dir in "${unpublished[@]}"; do
	tidy "$dir"
done
if ((tidy_back)); then
	if ((${#problems[@]} > 0)); then
		printf 'release: %s\n' "${problems[@]}" >&2
		exit 1
	fi
	say "tidied on their own and written back: ${tidied[*]:-none (every module was tidy)}"
	exit 0
fi
if ((${#problems[@]} > 0)); then
	printf 'release: %s\n' "${problems[@]}" >&2
	echo "release.sh: FAIL: fix the go.mod and go.sum files above on the branch being released (scripts/release.sh --tidy writes what tidy wants)" >&2
	exit 1
fi
say "go.sum filled from the tags, in order: ${released[*]}; then ${unpublished[*]}"

# --------------------------------------------------------------------------
# 3. one commit with every tag

final=$(git -C "$repo" commit-tree "HEAD^{tree}" -p "$base" \
	-m "release $version: the idem modules require each other at $version" \
	-m "Tags: $(for d in "${released[@]}"; do printf '%s ' "$(tagname "$d")"; done)")
git -C "$repo" checkout -q -B "release-$version" "$final"
for dir in "${released[@]}"; do
	git -C "$repo" tag -f -a -m "idem $(idem_path "$repo/$dir") $version" "$(tagname "$dir")" "$final" >/dev/null
done

# --------------------------------------------------------------------------
# 4. the module proxy, from the final tags

fetchcache="$work/fetch2"
mods=()
for dir in "${released[@]}"; do
	mods+=("$(idem_path "$repo/$dir")@$version")
done
go_fetch "${mods[@]}"
for dir in "${released[@]}"; do
	p=$(idem_path "$repo/$dir")
	a="$work/fetch1/cache/download/$p/@v/$version"
	b="$work/fetch2/cache/download/$p/@v/$version"
	if ! cmp -s "$a.ziphash" "$b.ziphash" || ! cmp -s "$a.mod" "$b.mod"; then
		echo "release.sh: $p at the final commit is not the module its siblings' go.sum entries were made from" >&2
		exit 1
	fi
done
proxy="$work/fetch2/cache/download"
say "module proxy: file://$proxy (${#released[@]} modules at $version, hashes as in every go.sum)"

# --------------------------------------------------------------------------
# 5. every module on its own

failed=()
for dir in "${workspace[@]}"; do
	if ! (cd "$repo/$dir" && quiet go_user readonly vet ./...); then
		failed+=("$dir")
	fi
done
if ((${#failed[@]} > 0)); then
	echo "release.sh: FAIL: GOWORK=off go vet ./... fails for ${failed[*]}, with the idem modules at $version from the proxy" >&2
	exit 1
fi
say "each of the ${#workspace[@]} modules vets on its own (GOWORK=off, its idem requirements from the proxy)"

# --------------------------------------------------------------------------
# 6. as a user gets them

if ! env IDEM_RELEASE_VERSION="$version" GOWORK=off GOFLAGS="$user_goflags" \
	GOPROXY="file://$proxy,$default_proxy" GONOSUMDB="$idem_prefix${GONOSUMDB:+,$GONOSUMDB}" GOPRIVATE= GONOPROXY= \
	bash "$src/scripts/outside-in.sh" "$repo"; then
	echo "release.sh: FAIL: the outside-in check" >&2
	exit 1
fi

# --------------------------------------------------------------------------

if ((rehearse)); then
	say "tagged on one commit: $(git -C "$repo" tag --points-at HEAD | tr '\n' ' ')"
	say "never tagged: ${unpublished[*]}"
	say "rehearsal passed: $version of ${#released[@]} modules tagged on one commit, fetched through a file:// module proxy, got and built outside the repository with no replace line ($(($(date +%s) - t_start))s)"
	exit 0
fi

refs=("refs/heads/release-$version:refs/heads/release-$version")
tags=()
for dir in "${released[@]}"; do
	tags+=("$(tagname "$dir")")
	refs+=("refs/tags/$(tagname "$dir"):refs/tags/$(tagname "$dir")")
done
git -C "$src" fetch -q "$repo" "${refs[@]}"
say "made the branch release-$version ($(git -C "$src" rev-parse --short "release-$version")) and the tags ${tags[*]}"
if ((push)); then
	git -C "$src" push origin "release-$version" "${tags[@]}"
	say "pushed release-$version ${tags[*]}"
	echo "Then fast-forward main to it: git checkout main && git merge --ff-only release-$version && git push origin main"
else
	echo
	echo "done, not pushed. To publish:"
	echo "  git push origin release-$version ${tags[*]}"
	echo "  git checkout main && git merge --ff-only release-$version && git push origin main"
	echo "To undo:"
	echo "  git tag -d ${tags[*]} && git branch -D release-$version"
fi
