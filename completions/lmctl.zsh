#compdef lmctl

_lmctl_completion() {
  eval $(env _TYPER_COMPLETE_ARGS="${words[1,$CURRENT]}" _LMCTL_COMPLETE=complete_zsh lmctl)
}

compdef _lmctl_completion lmctl
