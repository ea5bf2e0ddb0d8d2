from ackline.cli import main

raise SystemExit(main())
