from slimeish.cli import main

main()
