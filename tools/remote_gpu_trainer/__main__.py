from .rgt import main

main()
