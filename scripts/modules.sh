# shellcheck shell=bash
# The repository's modules, for scripts/release.sh and scripts/outside-in.sh
# (sourced, not run). Needs $root (the repository's top directory) set.
#
#   idem_path DIR             the module path in DIR/go.mod
#   idem_requires DIR         the idem modules DIR/go.mod requires, one a line
#   idem_released             the released modules' directories, relative to
#                             $root ("." for the root), every module after
#                             the idem modules it requires
#
# Every module that go.work uses is released (tagged, meant to be imported)
# except the ones listed in idem_unreleased: test-only modules and the
# example service, which keep their replace lines for ever.

idem_unreleased=(examples reliability migrations fiberidem/ginbench)

idem_prefix=github.com/idemkit/idem

idem_path() {
	awk '$1 == "module" { print $2; exit }' "$1/go.mod"
}

idem_requires() {
	# require lines (single or in a block), not replace lines.
	sed -E 's/^[[:space:]]*require[[:space:]]+//' "$1/go.mod" |
		awk -v p="$idem_prefix" '$0 !~ /=>/ && $1 !~ /^(module|replace|go|toolchain)$/ && ($1 == p || index($1, p "/") == 1) { print $1 }' |
		sort -u
}

# idem_workspace_dirs prints the directories go.work uses, relative to $root.
idem_workspace_dirs() {
	awk '
		/^use[[:space:]]*\(/ { inuse = 1; next }
		inuse && /^\)/ { inuse = 0; next }
		inuse { print $1; next }
		/^use[[:space:]]+[^(]/ { print $2 }
	' "$root/go.work" | sed -E 's#^\./##; s#^$#.#; s#/$##'
}

idem_released() {
	local dir u skip pending=() done_paths=" " progress path r ok next
	while read -r dir; do
		[[ -z "$dir" ]] && continue
		skip=0
		for u in "${idem_unreleased[@]}"; do
			[[ "$dir" == "$u" ]] && skip=1
		done
		((skip)) || pending+=("$dir")
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
			echo "modules.sh: cannot order ${next[*]}: they require an unreleased module or each other" >&2
			return 1
		fi
		pending=("${next[@]+"${next[@]}"}")
	done
}
