from lmperf.report.render import main

main()
