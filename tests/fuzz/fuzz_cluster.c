/* fuzz_cluster.c — the cluster file of `trident plan --cluster FILE`
 * (cluster_load: a YAML file naming a preset and overriding its fields). */
#include "fuzz.h"
#include "plan/cluster.h"

FUZZ_INIT(NULL)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file("cluster.yaml", data, size);
    FUZZ_GUARD();
    PlanCluster c;
    char err[CFG_ERR] = "";
    fuzz_check(cluster_load(path, &c, err), -1, err, "cluster_load");
    return 0;
}
