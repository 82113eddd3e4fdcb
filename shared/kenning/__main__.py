from kenning.cli import main

raise SystemExit(main())
