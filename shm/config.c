/* PLACEHOLDER: replaced by the config implementation (key table, strict parser). */
#include "kvr_config.h"
#include <string.h>
void kvr_config_defaults(struct kvr_config *cfg) { memset(cfg, 0, sizeof(*cfg)); }
