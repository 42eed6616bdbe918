/*
 * A stand-in for libdcmi.so: exports the DCMI functions the dcmi backend
 * binds, with the struct layouts of dcmi_interface_api.h (docs/ASCEND.md, 'DCMI C API').
 *
 * It keeps no state of its own: every stateful call runs the command in
 * VNPU_FAKE_DCMI_HELPER (dcmi_fake_helper.py) which acts on the simulator's
 * state file, so the C library, the simulator and its CLI all see the same
 * devices. The chip topology is read once, at dcmi_init, as the real library
 * enumerates devices once.
 *
 * Build: gcc -shared -fPIC -o libdcmi_fake.so libdcmi_fake.c
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DCMI_VDEV_RES_NAME_LEN 16
#define DCMI_VDEV_FOR_RESERVE 32
#define DCMI_SOC_SPLIT_MAX 32
#define DCMI_VDEV_SIZE ((2 * sizeof(unsigned long long)) + sizeof(unsigned int))
#define TEMPLATE_NAME_LEN 32
#define MAX_CHIP_NAME_LEN 32

#define DCMI_OK 0
#define DCMI_ERR_INVALID_PARAMETER (-8001)
#define DCMI_ERR_INNER_ERR (-8005)
#define DCMI_ERR_INVALID_DEVICE_ID (-8007)
#define DCMI_ERR_NOT_SUPPORT (-8255)

enum dcmi_main_cmd { DCMI_MAIN_CMD_DVPP = 0, DCMI_MAIN_CMD_VDEV_MNG = 52 };
enum {
    DCMI_VMNG_SUB_CMD_GET_VDEV_RESOURCE = 0,
    DCMI_VMNG_SUB_CMD_GET_TOTAL_RESOURCE = 1,
    DCMI_VMNG_SUB_CMD_GET_FREE_RESOURCE = 2,
};

struct dcmi_base_resource {
    unsigned long long token;
    unsigned long long token_max;
    unsigned long long task_timeout;
    unsigned int vfg_id;
    unsigned char vip_mode;
    unsigned char reserved[DCMI_VDEV_FOR_RESERVE - 1];
};
struct dcmi_computing_resource {
    float aic;
    float aiv;
    unsigned short dsa, rtsq, acsq, cdqm, c_core, ffts, sdma, pcie_dma;
    unsigned long long memory_size;
    unsigned int event_id, notify_id, stream_id, model_id;
    unsigned short topic_schedule_aicpu, host_ctrl_cpu, host_aicpu, device_aicpu, topic_ctrl_cpu_slot;
    unsigned int vdev_aicore_utilization;
    unsigned long long vdev_memory_total;
    unsigned long long vdev_memory_free;
    unsigned char reserved[DCMI_VDEV_FOR_RESERVE - DCMI_VDEV_SIZE];
};
struct dcmi_media_resource {
    float jpegd, jpege, vpc, vdec, pngd, venc;
    unsigned char reserved[DCMI_VDEV_FOR_RESERVE];
};
struct dcmi_create_vdev_res_stru {
    unsigned int vdev_id;
    unsigned int vfg_id;
    char template_name[TEMPLATE_NAME_LEN];
    unsigned char reserved[64];
};
struct dcmi_create_vdev_out {
    unsigned int vdev_id;
    unsigned int pcie_bus, pcie_device, pcie_func, vfg_id;
    unsigned char reserved[DCMI_VDEV_FOR_RESERVE];
};
struct dcmi_vdev_query_info {
    char name[DCMI_VDEV_RES_NAME_LEN];
    unsigned int status;
    unsigned int is_container_used;
    unsigned int vfid;
    unsigned int vfg_id;
    unsigned long long container_id;
    struct dcmi_base_resource base;
    struct dcmi_computing_resource computing;
    struct dcmi_media_resource media;
};
struct dcmi_vdev_query_stru {
    unsigned int vdev_id;
    struct dcmi_vdev_query_info query_info;
};
struct dcmi_soc_free_resource {
    unsigned int vfg_num, vfg_bitmap;
    struct dcmi_base_resource base;
    struct dcmi_computing_resource computing;
    struct dcmi_media_resource media;
};
struct dcmi_soc_total_resource {
    unsigned int vdev_num;
    unsigned int vdev_id[DCMI_SOC_SPLIT_MAX];
    unsigned int vfg_num, vfg_bitmap;
    struct dcmi_base_resource base;
    struct dcmi_computing_resource computing;
    struct dcmi_media_resource media;
};
struct dcmi_chip_info {
    unsigned char chip_type[MAX_CHIP_NAME_LEN];
    unsigned char chip_name[MAX_CHIP_NAME_LEN];
    unsigned char chip_ver[MAX_CHIP_NAME_LEN];
    unsigned int aicore_cnt;
};

/* The sizes of docs/ASCEND.md, 'Struct sizes and offsets': if this compiles, C agrees. */
_Static_assert(sizeof(struct dcmi_base_resource) == 64, "base");
_Static_assert(sizeof(struct dcmi_computing_resource) == 96, "computing");
_Static_assert(sizeof(struct dcmi_media_resource) == 56, "media");
_Static_assert(sizeof(struct dcmi_create_vdev_res_stru) == 104, "create res");
_Static_assert(sizeof(struct dcmi_create_vdev_out) == 52, "create out");
_Static_assert(sizeof(struct dcmi_vdev_query_info) == 256, "query info");
_Static_assert(sizeof(struct dcmi_vdev_query_stru) == 264, "query stru");
_Static_assert(sizeof(struct dcmi_soc_total_resource) == 360, "total");
_Static_assert(sizeof(struct dcmi_soc_free_resource) == 224, "free");

#define MAX_CHIPS 64
#define OUT_MAX 8192

struct chip {
    int logic, card, device;
    unsigned int phy, aicore;
    char model[MAX_CHIP_NAME_LEN];
};
static struct chip chips[MAX_CHIPS];
static int chip_count = -1; /* -1: dcmi_init not called */

/* Runs the helper with `args`; fills `out` with its reply (after "rc N")
 * and returns N, or DCMI_ERR_INNER_ERR if the helper could not run. */
static int helper(const char *args, char *out, size_t out_len)
{
    const char *cmd = getenv("VNPU_FAKE_DCMI_HELPER");
    char line[512];
    FILE *pipe;
    int rc = DCMI_ERR_INNER_ERR, have_rc = 0;
    size_t used = 0;

    out[0] = '\0';
    if (cmd == NULL || snprintf(line, sizeof(line), "%s %s", cmd, args) >= (int)sizeof(line))
        return DCMI_ERR_INNER_ERR;
    pipe = popen(line, "r");
    if (pipe == NULL)
        return DCMI_ERR_INNER_ERR;
    while (fgets(line, sizeof(line), pipe) != NULL) {
        if (!have_rc && sscanf(line, "rc %d", &rc) == 1) {
            have_rc = 1;
            continue;
        }
        size_t n = strlen(line);
        if (used + n + 1 < out_len) {
            memcpy(out + used, line, n + 1);
            used += n;
        }
    }
    if (pclose(pipe) != 0 || !have_rc)
        return DCMI_ERR_INNER_ERR;
    return rc;
}

/* Value of the first "key N" line of a helper reply. */
static int field(const char *reply, const char *key, unsigned long long *value)
{
    const char *p = reply;
    size_t klen = strlen(key);
    while (p != NULL && *p != '\0') {
        if (strncmp(p, key, klen) == 0 && p[klen] == ' ')
            return sscanf(p + klen + 1, "%llu", value) == 1 ? 0 : -1;
        p = strchr(p, '\n');
        if (p != NULL)
            p++;
    }
    return -1;
}

static struct chip *find_chip(int card_id, int device_id)
{
    for (int i = 0; i < chip_count; i++)
        if (chips[i].card == card_id && chips[i].device == device_id)
            return &chips[i];
    return NULL;
}

int dcmi_init(void)
{
    char reply[OUT_MAX];
    int rc = helper("topology", reply, sizeof(reply));
    if (rc != DCMI_OK)
        return rc;
    chip_count = 0;
    for (char *p = strtok(reply, "\n"); p != NULL && chip_count < MAX_CHIPS; p = strtok(NULL, "\n")) {
        struct chip *c = &chips[chip_count];
        if (sscanf(p, "chip %d %d %d %u %u %31s", &c->logic, &c->card, &c->device, &c->phy,
                   &c->aicore, c->model) == 6)
            chip_count++;
    }
    return DCMI_OK;
}

int dcmi_get_card_num_list(int *card_num, int *card_list, int list_len)
{
    int n = 0;
    if (chip_count < 0 || card_num == NULL || card_list == NULL)
        return DCMI_ERR_INVALID_PARAMETER;
    for (int i = 0; i < chip_count; i++) {
        int seen = 0;
        for (int j = 0; j < n; j++)
            seen |= card_list[j] == chips[i].card;
        if (!seen) {
            if (n >= list_len)
                return DCMI_ERR_INVALID_PARAMETER;
            card_list[n++] = chips[i].card;
        }
    }
    *card_num = n;
    return DCMI_OK;
}

int dcmi_get_device_num_in_card(int card_id, int *device_num)
{
    int n = 0;
    if (device_num == NULL)
        return DCMI_ERR_INVALID_PARAMETER;
    for (int i = 0; i < chip_count; i++)
        n += chips[i].card == card_id;
    if (n == 0)
        return DCMI_ERR_INVALID_DEVICE_ID;
    *device_num = n;
    return DCMI_OK;
}

int dcmi_get_device_logic_id(int *device_logic_id, int card_id, int device_id)
{
    struct chip *c = find_chip(card_id, device_id);
    if (device_logic_id == NULL)
        return DCMI_ERR_INVALID_PARAMETER;
    if (c == NULL)
        return DCMI_ERR_INVALID_DEVICE_ID;
    *device_logic_id = c->logic;
    return DCMI_OK;
}

int dcmi_get_device_phyid_from_logicid(unsigned int logicid, unsigned int *phyid)
{
    if (phyid == NULL)
        return DCMI_ERR_INVALID_PARAMETER;
    for (int i = 0; i < chip_count; i++)
        if ((unsigned int)chips[i].logic == logicid) {
            *phyid = chips[i].phy;
            return DCMI_OK;
        }
    return DCMI_ERR_INVALID_DEVICE_ID;
}

int dcmi_get_device_logicid_from_phyid(unsigned int phyid, unsigned int *logicid)
{
    if (logicid == NULL)
        return DCMI_ERR_INVALID_PARAMETER;
    for (int i = 0; i < chip_count; i++)
        if (chips[i].phy == phyid) {
            *logicid = (unsigned int)chips[i].logic;
            return DCMI_OK;
        }
    return DCMI_ERR_INVALID_DEVICE_ID;
}

int dcmi_get_card_id_device_id_from_logicid(int *card_id, int *device_id, unsigned int device_logic_id)
{
    if (card_id == NULL || device_id == NULL)
        return DCMI_ERR_INVALID_PARAMETER;
    for (int i = 0; i < chip_count; i++)
        if ((unsigned int)chips[i].logic == device_logic_id) {
            *card_id = chips[i].card;
            *device_id = chips[i].device;
            return DCMI_OK;
        }
    return DCMI_ERR_INVALID_DEVICE_ID;
}

int dcmi_get_device_chip_info(int card_id, int device_id, struct dcmi_chip_info *chip_info)
{
    struct chip *c = find_chip(card_id, device_id);
    if (chip_info == NULL)
        return DCMI_ERR_INVALID_PARAMETER;
    if (c == NULL)
        return DCMI_ERR_INVALID_DEVICE_ID;
    memset(chip_info, 0, sizeof(*chip_info));
    snprintf((char *)chip_info->chip_type, MAX_CHIP_NAME_LEN, "Ascend");
    snprintf((char *)chip_info->chip_name, MAX_CHIP_NAME_LEN, "%s", c->model);
    snprintf((char *)chip_info->chip_ver, MAX_CHIP_NAME_LEN, "V1");
    chip_info->aicore_cnt = c->aicore;
    return DCMI_OK;
}

int dcmi_get_device_health(int card_id, int device_id, unsigned int *health)
{
    char args[64], reply[OUT_MAX];
    unsigned long long value;
    struct chip *c = find_chip(card_id, device_id);
    int rc;
    if (health == NULL)
        return DCMI_ERR_INVALID_PARAMETER;
    if (c == NULL)
        return DCMI_ERR_INVALID_DEVICE_ID;
    snprintf(args, sizeof(args), "health %d", c->logic);
    rc = helper(args, reply, sizeof(reply));
    if (rc != DCMI_OK)
        return rc;
    if (field(reply, "health", &value) != 0)
        return DCMI_ERR_INNER_ERR;
    *health = (unsigned int)value;
    return DCMI_OK;
}

/* Fills the computing/media parts shared by total, free and vdev replies. */
static int fill_resources(const char *reply, struct dcmi_computing_resource *computing,
                          struct dcmi_media_resource *media)
{
    unsigned long long aicore, memory, aicpu, units;
    if (field(reply, "aicore", &aicore) || field(reply, "memory", &memory) ||
        field(reply, "aicpu", &aicpu) || field(reply, "media", &units))
        return DCMI_ERR_INNER_ERR;
    computing->aic = (float)aicore;
    computing->aiv = (float)aicore;
    computing->memory_size = memory;
    computing->device_aicpu = (unsigned short)aicpu;
    media->vpc = (float)units;
    media->jpegd = (float)(3 * units);
    media->jpege = (float)(units / 2);
    media->vdec = (float)(units / 4);
    return DCMI_OK;
}

static int get_total(struct chip *c, struct dcmi_soc_total_resource *total)
{
    char args[64], reply[OUT_MAX];
    int rc;
    snprintf(args, sizeof(args), "total %d", c->logic);
    rc = helper(args, reply, sizeof(reply));
    if (rc != DCMI_OK)
        return rc;
    memset(total, 0, sizeof(*total));
    for (const char *p = reply; p != NULL && *p != '\0';) {
        unsigned int id;
        if (sscanf(p, "vdev %u", &id) == 1 && total->vdev_num < DCMI_SOC_SPLIT_MAX)
            total->vdev_id[total->vdev_num++] = id;
        p = strchr(p, '\n');
        if (p != NULL)
            p++;
    }
    return fill_resources(reply, &total->computing, &total->media);
}

static int get_free(struct chip *c, struct dcmi_soc_free_resource *free_res)
{
    char args[64], reply[OUT_MAX];
    int rc;
    snprintf(args, sizeof(args), "free %d", c->logic);
    rc = helper(args, reply, sizeof(reply));
    if (rc != DCMI_OK)
        return rc;
    memset(free_res, 0, sizeof(*free_res));
    return fill_resources(reply, &free_res->computing, &free_res->media);
}

static int get_vdev(struct chip *c, struct dcmi_vdev_query_stru *query)
{
    char args[64], reply[OUT_MAX];
    unsigned long long used;
    const char *name;
    int rc;
    snprintf(args, sizeof(args), "vdev %d %u", c->logic, query->vdev_id);
    rc = helper(args, reply, sizeof(reply));
    if (rc != DCMI_OK)
        return rc;
    memset(&query->query_info, 0, sizeof(query->query_info));
    name = strstr(reply, "name ");
    if (name == NULL || field(reply, "used", &used) != 0)
        return DCMI_ERR_INNER_ERR;
    sscanf(name + 5, "%15s", query->query_info.name);
    query->query_info.is_container_used = (unsigned int)used;
    /* Kubernetes hosts: the driver cannot read a docker id from the cpuset. */
    query->query_info.container_id = used ? 0xFFFFFFFFFFFFULL : 0;
    return fill_resources(reply, &query->query_info.computing, &query->query_info.media);
}

int dcmi_get_device_info(int card_id, int device_id, enum dcmi_main_cmd main_cmd,
                         unsigned int sub_cmd, void *buf, unsigned int *size)
{
    struct chip *c = find_chip(card_id, device_id);
    if (buf == NULL || size == NULL)
        return DCMI_ERR_INVALID_PARAMETER;
    if (c == NULL)
        return DCMI_ERR_INVALID_DEVICE_ID;
    if (main_cmd != DCMI_MAIN_CMD_VDEV_MNG)
        return DCMI_ERR_NOT_SUPPORT;
    switch (sub_cmd) {
    case DCMI_VMNG_SUB_CMD_GET_TOTAL_RESOURCE:
        if (*size < sizeof(struct dcmi_soc_total_resource))
            return DCMI_ERR_INVALID_PARAMETER;
        *size = sizeof(struct dcmi_soc_total_resource);
        return get_total(c, buf);
    case DCMI_VMNG_SUB_CMD_GET_FREE_RESOURCE:
        if (*size < sizeof(struct dcmi_soc_free_resource))
            return DCMI_ERR_INVALID_PARAMETER;
        *size = sizeof(struct dcmi_soc_free_resource);
        return get_free(c, buf);
    case DCMI_VMNG_SUB_CMD_GET_VDEV_RESOURCE:
        if (*size < sizeof(struct dcmi_vdev_query_stru))
            return DCMI_ERR_INVALID_PARAMETER;
        *size = sizeof(struct dcmi_vdev_query_stru);
        return get_vdev(c, buf);
    default:
        return DCMI_ERR_NOT_SUPPORT;
    }
}

int dcmi_create_vdevice(int card_id, int device_id, struct dcmi_create_vdev_res_stru *vdev,
                        struct dcmi_create_vdev_out *out)
{
    char args[128], reply[OUT_MAX], name[TEMPLATE_NAME_LEN];
    unsigned long long id;
    struct chip *c = find_chip(card_id, device_id);
    int rc;
    if (vdev == NULL || out == NULL)
        return DCMI_ERR_INVALID_PARAMETER;
    if (c == NULL)
        return DCMI_ERR_INVALID_DEVICE_ID;
    memcpy(name, vdev->template_name, sizeof(name));
    name[sizeof(name) - 1] = '\0';
    /* The name goes into a shell command: letters, digits and '_' only. */
    if (name[0] == '\0')
        return DCMI_ERR_INVALID_PARAMETER;
    for (const char *p = name; *p != '\0'; p++)
        if (!isalnum((unsigned char)*p) && *p != '_')
            return DCMI_ERR_INVALID_PARAMETER;
    snprintf(args, sizeof(args), "create %d %s %u", c->logic, name, vdev->vdev_id);
    rc = helper(args, reply, sizeof(reply));
    if (rc != DCMI_OK)
        return rc;
    if (field(reply, "id", &id) != 0)
        return DCMI_ERR_INNER_ERR;
    memset(out, 0, sizeof(*out));
    out->vdev_id = (unsigned int)id;
    return DCMI_OK;
}

int dcmi_set_destroy_vdevice(int card_id, int device_id, unsigned int vdevid)
{
    char args[64], reply[OUT_MAX];
    struct chip *c = find_chip(card_id, device_id);
    if (c == NULL)
        return DCMI_ERR_INVALID_DEVICE_ID;
    snprintf(args, sizeof(args), "destroy %d %u", c->logic, vdevid);
    return helper(args, reply, sizeof(reply));
}

int dcmi_get_vnpu_config_recover_mode(unsigned int *mode)
{
    char reply[OUT_MAX];
    unsigned long long value;
    int rc;
    if (mode == NULL)
        return DCMI_ERR_INVALID_PARAMETER;
    rc = helper("getrecover", reply, sizeof(reply));
    if (rc != DCMI_OK)
        return rc;
    if (field(reply, "mode", &value) != 0)
        return DCMI_ERR_INNER_ERR;
    *mode = (unsigned int)value;
    return DCMI_OK;
}

int dcmi_set_vnpu_config_recover_mode(unsigned int mode)
{
    char args[32], reply[OUT_MAX];
    if (mode > 1)
        return DCMI_ERR_INVALID_PARAMETER;
    snprintf(args, sizeof(args), "setrecover %u", mode);
    return helper(args, reply, sizeof(reply));
}
