# bash completion for fulcrum(8): commands, their flags, -config files, and
# the running daemon's SERVICE/BACKEND names for `fulcrum set`.
_fulcrum() {
	local cur words
	# The words as typed, split at blanks only: bash's COMP_WORDS also splits
	# at ':' (COMP_WORDBREAKS), which cuts `-admin 127.0.0.1:9900` in three.
	read -ra words <<<"${COMP_LINE:0:COMP_POINT}"
	[[ ${COMP_LINE:0:COMP_POINT} == *[[:blank:]] ]] && words+=("")
	cur=${words[${#words[@]}-1]}
	COMPREPLY=()
	__fulcrum_complete
	# bash replaces only what follows the word's last ':'.
	if [[ $cur == *:* && $COMP_WORDBREAKS == *:* ]]; then
		local colon=${cur%"${cur##*:}"}
		COMPREPLY=("${COMPREPLY[@]#"$colon"}")
	fi
}

# __fulcrum_complete fills COMPREPLY for cur, the last of words.
__fulcrum_complete() {
	local prev cmd i cword=$((${#words[@]} - 1))
	prev=${words[cword-1]}

	case $prev in
	-config | --config)
		compopt -o filenames 2>/dev/null
		COMPREPLY=($(compgen -f -X '!*.toml' -- "$cur") $(compgen -d -- "$cur"))
		return
		;;
	-admin | --admin | -listen | --listen)
		COMPREPLY=($(compgen -W '127.0.0.1:9900' -- "$cur"))
		return
		;;
	-n)
		return
		;;
	esac

	cmd=
	for ((i = 1; i < cword; i++)); do
		case ${words[i]} in
		status | drain | set | healthz | upgrade | demo | version) cmd=${words[i]}; break ;;
		esac
	done

	local flags
	case $cmd in
	status) flags='-config -admin -json -v -events -h' ;;
	set) flags='-config -admin -list -h' ;;
	drain) flags='-config -admin -undo -h' ;;
	healthz) flags='-config -admin -h' ;;
	upgrade) flags='-config -admin -h' ;;
	demo) flags='-listen -n -h' ;;
	version) flags= ;;
	*) flags='-config -check -q -version -h' ;;
	esac

	if [[ -z $cmd && $cur != -* ]]; then
		COMPREPLY=($(compgen -W 'status drain set healthz upgrade demo version' -- "$cur"))
		return
	fi
	if [[ $cmd == set && $cur != -* ]]; then
		# Which operand cur is (SERVICE/BACKEND, then the state), and how
		# this command line would ask the running daemon for its names.
		local n=0 ask=() j
		for ((j = i + 1; j < cword; j++)); do
			case ${words[j]} in
			-config | --config | -admin | --admin) ask+=("${words[j]}" "${words[j+1]/#\~/$HOME}"); ((j++)) ;;
			-config=* | --config=* | -admin=* | --admin=*) ask+=("${words[j]}") ;;
			-*) ;;
			*) ((n++)) ;;
			esac
		done
		case $n in
		0) COMPREPLY=($(compgen -W "$(fulcrum set -list "${ask[@]}" 2>/dev/null)" -- "$cur")) ;;
		1) COMPREPLY=($(compgen -W 'drain maint ready writer' -- "$cur")) ;;
		esac
		return
	fi
	COMPREPLY=($(compgen -W "$flags" -- "$cur"))
}
complete -F _fulcrum fulcrum
