/* Private interface shared by the store's files: the settings sm_store_configure installed. */
#ifndef SM_STORE_INTERNAL_H
#define SM_STORE_INTERNAL_H
#include "store/store.h"

/* the current settings (strings NULL when unset; owned by the store) */
const sm_store_settings *sm_store_settings_get(void);
/* <home>/rel, home defaulting to /tmp (malloc'd) */
char *sm_store_home_join(const char *rel);

#endif
