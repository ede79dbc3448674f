from kvpool.cli import main

main()
