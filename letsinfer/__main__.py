from letsinfer.cli import main

main()
