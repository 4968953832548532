from wanprobe.cli import main

main()
