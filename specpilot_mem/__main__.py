from specpilot_mem.main import main

raise SystemExit(main())
