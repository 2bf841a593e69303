from camp_cli.main import main

main()
