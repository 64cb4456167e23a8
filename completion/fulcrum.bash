# bash completion for fulcrum(8): commands, their flags, and -config files.
_fulcrum() {
	local cur prev cmd i
	COMPREPLY=()
	cur=${COMP_WORDS[COMP_CWORD]}
	prev=${COMP_WORDS[COMP_CWORD-1]}

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
	for ((i = 1; i < COMP_CWORD; i++)); do
		case ${COMP_WORDS[i]} in
		status | drain | set | healthz | upgrade | demo | version) cmd=${COMP_WORDS[i]}; break ;;
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
	if [[ $cmd == set && $cur != -* && $prev == */* ]]; then
		COMPREPLY=($(compgen -W 'drain maint ready writer' -- "$cur"))
		return
	fi
	if [[ $cmd == set && $cur != -* && $prev != -config && $prev != -admin ]]; then
		# The running daemon's names, asked the way this command line would ask.
		local ask=() j
		for ((j = 1; j < COMP_CWORD; j++)); do
			case ${COMP_WORDS[j]} in
			-config | -admin) ask+=("${COMP_WORDS[j]}" "${COMP_WORDS[j+1]}") ;;
			esac
		done
		COMPREPLY=($(compgen -W "$(fulcrum set -list "${ask[@]}" 2>/dev/null)" -- "$cur"))
		return
	fi
	COMPREPLY=($(compgen -W "$flags" -- "$cur"))
}
complete -F _fulcrum fulcrum
