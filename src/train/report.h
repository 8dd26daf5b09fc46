/* report.h — `trident report RUN_DIR [--out FILE]`: one self-contained HTML
 * page of a run (curves as inline SVG, the memory table, the config, and
 * per-rank step and idle times from trace.json when there is one), made
 * from the files a run leaves in its run.dir.  No network, no scripts. */
#ifndef TRD_REPORT_H
#define TRD_REPORT_H

int report_main(int argc, char **argv);

#endif
