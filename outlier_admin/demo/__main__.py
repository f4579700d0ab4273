from outlier_admin.demo.runner import main

raise SystemExit(main())
