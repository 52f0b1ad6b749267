# shellcheck shell=bash
# The repository's modules, for scripts/release.sh and scripts/outside-in.sh
# (sourced, not run). Needs $root (the repository's top directory) set.
#
# Every module go.work uses says in its go.mod's first line whether it is
# published (tagged with every release, meant to be imported or installed)
# or not (test-only modules and the example service, never tagged):
#
#   // idem release: published, tagged with every release (docs/releasing.md).
#   // idem release: not published: tests only, never tagged (docs/releasing.md).
#
# A module without that line is an error: its status is never a default.
#
#   idem_workspace_dirs       the directories go.work uses, relative to $root
#                             ("." for the root)
#   idem_path DIR             the module path in DIR/go.mod
#   idem_status DIR           "published", "unpublished", or nothing (no line)
#   idem_requires DIR         the idem modules DIR/go.mod requires, one a line
#   idem_requirements DIR     the same, as "path version"
#   idem_replaces DIR         the idem modules DIR/go.mod replaces, one a line
#   idem_released             the published modules' directories, every
#                             module after the idem modules it requires
#   idem_unpublished          the other workspace modules' directories
#   idem_version              the one version of idem modules every go.mod
#                             requires (empty if none requires any)
#   idem_check                every rule above and in docs/releasing.md;
#                             prints each problem with its fix, fails if any
#   idem_fix                  fixes what idem_check finds and a script can:
#                             drops idem replace lines from go.mod files,
#                             requires idem modules at idem_version, writes
#                             go.work's replace block (not the status line)

idem_prefix=github.com/idemkit/idem

# idem_is_idem PATH: PATH is the root module's path or below it.
idem_is_idem() {
	[[ "$1" == "$idem_prefix" || "$1" == "$idem_prefix"/* ]]
}

idem_path() {
	awk '$1 == "module" { print $2; exit }' "$1/go.mod"
}

idem_status() {
	local line
	line=$(grep -m1 '^// idem release:' "$1/go.mod" || true)
	case "$line" in
	"// idem release: published"*) echo published ;;
	"// idem release: not published"*) echo unpublished ;;
	esac
}

# _idem_directive FILE VERB prints the lines of the VERB directives
# (require, replace, use) of a go.mod or go.work, in single-line and block
# form alike, without the verb.
_idem_directive() {
	awk -v verb="$2" '
		{ sub(/\/\/.*/, "") }
		$1 == verb && $2 == "(" { inblock = 1; next }
		inblock && $1 == ")" { inblock = 0; next }
		inblock && NF > 0 { sub(/^[ \t]+/, ""); sub(/[ \t]+$/, ""); print; next }
		$1 == verb && NF > 1 { $1 = ""; sub(/^ +/, ""); print }
	' "$1"
}

idem_requirements() {
	_idem_directive "$1/go.mod" require | awk -v p="$idem_prefix" '$1 == p || index($1, p "/") == 1 { print $1, $2 }' | sort -u
}

idem_requires() {
	idem_requirements "$1" | awk '{ print $1 }'
}

idem_replaces() {
	_idem_directive "$1/go.mod" replace | awk -v p="$idem_prefix" '$1 == p || index($1, p "/") == 1 { print $1 }' | sort -u
}

idem_workspace_dirs() {
	_idem_directive "$root/go.work" use | awk '{ print $1 }' | sed -E 's#^\./##; s#^$#.#; s#/$##'
}

idem_unpublished() {
	local dir
	while read -r dir; do
		[[ -n "$dir" && "$(idem_status "$root/$dir")" != published ]] && echo "$dir"
	done < <(idem_workspace_dirs)
	return 0
}

idem_released() {
	local dir pending=() done_paths=" " progress path r ok next
	while read -r dir; do
		[[ -n "$dir" && "$(idem_status "$root/$dir")" == published ]] && pending+=("$dir")
	done < <(idem_workspace_dirs)
	while ((${#pending[@]} > 0)); do
		progress=0
		next=()
		for dir in "${pending[@]}"; do
			ok=1
			path=$(idem_path "$root/$dir")
			while read -r r; do
				[[ -z "$r" || "$r" == "$path" ]] && continue
				[[ "$done_paths" == *" $r "* ]] || ok=0
			done < <(idem_requires "$root/$dir")
			if ((ok)); then
				echo "$dir"
				done_paths+="$path "
				progress=1
			else
				next+=("$dir")
			fi
		done
		if ((!progress)); then
			echo "modules.sh: cannot order ${next[*]}: they require an unpublished module or each other" >&2
			return 1
		fi
		pending=("${next[@]+"${next[@]}"}")
	done
}

idem_version() {
	local dir
	while read -r dir; do
		[[ -n "$dir" ]] && idem_requirements "$root/$dir" | awk '{ print $2 }'
	done < <(idem_workspace_dirs) | sort | uniq -c | sort -rn | awk 'NR == 1 { print $2 }'
}

# idem_work_replaces prints the replace lines go.work must have: one per
# published module, at version $1, to its directory.
idem_work_replaces() {
	local dir
	while read -r dir; do
		[[ -z "$dir" || "$(idem_status "$root/$dir")" != published ]] && continue
		if [[ "$dir" == "." ]]; then
			echo "$(idem_path "$root/$dir") $1 => ./"
		else
			echo "$(idem_path "$root/$dir") $1 => ./$dir"
		fi
	done < <(idem_workspace_dirs) | sort
}

idem_check() {
	local dir path status p v r problems=() version want have
	declare -A status_of=() dir_of=()
	version=$(idem_version)
	while read -r dir; do
		[[ -z "$dir" ]] && continue
		if [[ ! -f "$root/$dir/go.mod" ]]; then
			problems+=("go.work uses $dir, which has no go.mod")
			continue
		fi
		path=$(idem_path "$root/$dir")
		dir_of[$path]=$dir
		status=$(idem_status "$root/$dir")
		status_of[$path]=$status
		if [[ -z "$status" ]]; then
			problems+=("$dir/go.mod does not say whether it is published: make its first line
    // idem release: published, tagged with every release (docs/releasing.md).
  or, for a module of tests (or an example) that no user imports,
    // idem release: not published: tests only, never tagged (docs/releasing.md).")
		fi
	done < <(idem_workspace_dirs)
	while read -r dir; do
		[[ -z "$dir" || ! -f "$root/$dir/go.mod" ]] && continue
		for p in $(idem_replaces "$root/$dir"); do
			problems+=("$dir/go.mod replaces $p: drop it (cd $dir && go mod edit -dropreplace=$p); go.work joins the modules (scripts/release.sh --tidy does it)")
		done
		while read -r p v; do
			[[ -z "$p" ]] && continue
			if [[ -z "${dir_of[$p]+x}" ]]; then
				problems+=("$dir/go.mod requires $p, which is not a module of go.work")
			elif [[ "${status_of[$p]}" == unpublished ]]; then
				problems+=("$dir/go.mod requires $p, which is not published (a user could not get it): move what it needs into a published module")
			fi
			if [[ "$v" != "$version" ]]; then
				problems+=("$dir/go.mod requires $p $v, the other modules $version: cd $dir && go mod edit -require=$p@$version (scripts/release.sh --tidy does it)")
			fi
		done < <(idem_requirements "$root/$dir")
	done < <(idem_workspace_dirs)
	if [[ -n "$version" ]]; then
		want=$(idem_work_replaces "$version")
		have=$(_idem_directive "$root/go.work" replace | awk -v p="$idem_prefix" '$1 == p || index($1, p "/") == 1' | sed -E 's/[[:space:]]+/ /g; s/ $//' | sort)
		if [[ "$want" != "$have" ]]; then
			problems+=("go.work's replace lines for idem modules must be exactly these (one per published module, at the version the go.mod files require, $version; scripts/release.sh --tidy writes them):
$(sed 's/^/    /' <<<"$want")")
		fi
	fi
	if ((${#problems[@]} > 0)); then
		printf 'modules: %s\n' "${problems[@]}" >&2
		echo "modules: the rules are in docs/releasing.md, \"Which modules are published\"" >&2
		return 1
	fi
}

# The comment above go.work's replace block, which idem_fix writes.
idem_work_comment='// The version every go.mod of the workspace requires of a published idem
// module is this directory'"'"'s code, without a download: scripts/release.sh
// keeps these lines at that version (docs/releasing.md).'

idem_fix() {
	local dir p version args
	version=$(idem_version)
	[[ -n "$version" ]] || return 0
	while read -r dir; do
		[[ -z "$dir" || ! -f "$root/$dir/go.mod" ]] && continue
		args=()
		for p in $(idem_replaces "$root/$dir"); do
			args+=("-dropreplace=$p")
		done
		for p in $(idem_requires "$root/$dir"); do
			args+=("-require=$p@$version")
		done
		if ((${#args[@]} > 0)); then
			(cd "$root/$dir" && go mod edit "${args[@]}")
		fi
	done < <(idem_workspace_dirs)
	# go.work: every idem replace line out (and the comment and block they
	# were in), then the block as it must be.
	awk -v p="$idem_prefix" '
		/^\/\/ The version every go.mod of the workspace requires/ { skipc = 1 }
		skipc && /^\/\// { next }
		{ skipc = 0 }
		$1 == "replace" && $2 == "(" { inblock = 1; n = 0; next }
		inblock && $1 == ")" {
			inblock = 0
			if (n > 0) { print "replace ("; for (i = 1; i <= n; i++) print kept[i]; print ")" }
			next
		}
		inblock { if ($1 == p || index($1, p "/") == 1) next; kept[++n] = $0; next }
		$1 == "replace" && ($2 == p || index($2, p "/") == 1) { next }
		{ print }
	' "$root/go.work" | cat -s >"$root/go.work.tmp"
	# no blank line at the end, then the block
	sed -e :a -e '/^\n*$/{$d;N;ba' -e '}' "$root/go.work.tmp" >"$root/go.work"
	rm -f "$root/go.work.tmp"
	{
		echo
		echo "$idem_work_comment"
		echo "replace ("
		idem_work_replaces "$version" | sed 's/^/\t/'
		echo ")"
	} >>"$root/go.work"
}
