from kenning.commands.cli import main

raise SystemExit(main())
