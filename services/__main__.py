from services.entry import main

main()
