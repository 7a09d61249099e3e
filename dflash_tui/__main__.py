from dflash_tui.cli import main

main(prog_name="dflash")  # help, errors and shell completion name the command as installed
