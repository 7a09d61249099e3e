from dflash_tui.cli import main

main()
