from aotc.cli.main import main

main()
