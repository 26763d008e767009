/*
 * A fake libnvidia-ml.so.1 for tests: NVIDIA's own nvml.h, so every struct has the header's real
 * layout, loaded by the real, unmodified pynvml through LD_LIBRARY_PATH.
 *
 * Strict where NVML is: it dereferences every pointer argument (a struct passed by value where a
 * pointer is expected reads and writes through garbage, as it did on a real H100), refuses a
 * versioned struct whose version word is zero or unknown (NVML_ERROR_ARGUMENT_VERSION_MISMATCH),
 * answers NVML_ERROR_UNINITIALIZED before nvmlInit, and fills padding bytes with garbage, so a
 * binding that declares a narrower C field wider (pynvml's fabric `state`: unsigned char in the
 * header, c_uint in pynvml) reads the garbage, not a lucky zero.
 *
 * What it answers comes from a flat scenario file written by tests/nvml_fake/__init__.py from the
 * Python scenarios in health/fakes.py (one source of truth), named by RGT_FAKE_NVML_SCENARIO.
 * Faults: RGT_FAKE_NVML_FAULT=segv:<function>[@<gpu>] or hang:<function>[@<gpu>] crashes (a real
 * NULL write) or blocks inside that call; with RGT_FAKE_NVML_FAULT_ONCE=<path> only the first time
 * (the file is created then). A hang lasts RGT_FAKE_NVML_HANG_S seconds (default 120).
 */
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_GPUS 16
#define MAX_ERRS 64
#define MAX_PROCS 64
#define MAX_FIELDS 16
#define NO_LATER 0xFFFFFFFFFFFFFFFFull

typedef struct { char fn[72]; int code; } fn_err_t;
typedef struct { int kind; unsigned int pid; unsigned long long used; } proc_t; /* kind: 0 compute, 1 graphics, 2 mps */
typedef struct { unsigned int id; int ret; unsigned long long value; } field_t;

struct nvmlDevice_st {
    int index, lost;
    char lost_from[72]; /* the GPU falls off the bus when this call is made; lost from then on */
    int lost_code;
    char name[96], uuid[96], bus[32], vbios[32];
    unsigned int minor;
    fn_err_t errs[MAX_ERRS];
    int nerrs;
    unsigned int ecc_cur, ecc_pend;
    unsigned long long ecc[2][2];
    int ecc_err[2][2];
    unsigned int remap[4];
    unsigned int retired[2], retired_pending;
    int inforom_valid;
    unsigned int temp, thr[8];
    int thr_err[8];
    unsigned long long reasons;
    unsigned int util_gpu, util_mem;
    unsigned int power_limit, power_default, power_usage;
    unsigned int pcie_width, pcie_max_width, pcie_gen, pcie_max_gen;
    unsigned int compute_mode, persistence, mig_cur, mig_pend;
    unsigned int fabric_state, fabric_status;
    int nlinks;
    unsigned int links[NVML_NVLINK_MAX_LINKS];
    int mem_v1_only;
    unsigned long long mem_total, mem_used, mem_reserved;
    proc_t procs[MAX_PROCS];
    int nprocs;
    unsigned long long viol[2], viol_later[2];
    int viol_err[2], viol_reads[2];
    field_t fields[MAX_FIELDS];
    int nfields;
    char hang_fn[4][72];
    int nhang;
    int cc_major, cc_minor;
};

static struct nvmlDevice_st gpus[MAX_GPUS];
static int gpu_count = 0;
static int initialized = 0;
static int init_code = NVML_SUCCESS;
static char driver_version[80] = "570.86.15";
static char nvml_version[80] = "12.570.86.15";
static int cuda_version = 12080;
static char fault_kind[8], fault_fn[72];
static int fault_gpu = -1;

static unsigned int hang_seconds(void) {
    const char *text = getenv("RGT_FAKE_NVML_HANG_S");
    return text ? (unsigned int)atoi(text) : 120;
}

static void hang(void) {
    unsigned int left = hang_seconds();
    while (left > 0) left = sleep(left);
}

static void crash(void) {
    /* A real SIGSEGV, as a driver bug or a bad pointer gives. The address is read from a volatile,
     * so the compiler cannot prove this store undefined and drop the whole branch. */
    static volatile uintptr_t nowhere = 16;
    *(volatile int *)nowhere = 1;
}

/* The env-selected fault, when it matches this call (and, with RGT_FAKE_NVML_FAULT_ONCE, has not fired yet). */
static void maybe_fault(const char *fn, int gpu) {
    if (!fault_kind[0] || strcmp(fn, fault_fn) != 0 || (fault_gpu >= 0 && gpu != fault_gpu)) return;
    const char *once = getenv("RGT_FAKE_NVML_FAULT_ONCE");
    if (once && *once) {
        int fd = open(once, O_CREAT | O_EXCL | O_WRONLY, 0600);
        if (fd < 0) return; /* already fired */
        close(fd);
    }
    if (strcmp(fault_kind, "segv") == 0) crash();
    if (strcmp(fault_kind, "hang") == 0) hang();
}

static void parse_fault(void) {
    const char *text = getenv("RGT_FAKE_NVML_FAULT");
    fault_kind[0] = 0;
    if (!text || !*text) return;
    const char *colon = strchr(text, ':');
    if (!colon || colon - text >= (long)sizeof(fault_kind)) return;
    memcpy(fault_kind, text, (size_t)(colon - text));
    fault_kind[colon - text] = 0;
    snprintf(fault_fn, sizeof(fault_fn), "%s", colon + 1);
    char *at = strchr(fault_fn, '@');
    if (at) {
        *at = 0;
        fault_gpu = atoi(at + 1);
    }
}

static void rstrip(char *s) {
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ')) s[--n] = 0;
}

static void set_field(struct nvmlDevice_st *g, unsigned int id, int ret, unsigned long long value) {
    if (g->nfields < MAX_FIELDS) g->fields[g->nfields++] = (field_t){id, ret, value};
}

static unsigned int field_id(const char *name) {
    if (!strcmp(name, "recovery")) return NVML_FI_DEV_GET_GPU_RECOVERY_ACTION;
    if (!strcmp(name, "pcie_replay")) return NVML_FI_DEV_PCIE_REPLAY_COUNTER;
    if (!strcmp(name, "nvlink_replay")) return NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL;
    if (!strcmp(name, "nvlink_recovery")) return NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL;
    if (!strcmp(name, "nvlink_crc_flit")) return NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL;
    return 0;
}

/* One line of the scenario: "<key> <value...>" for the system, "<gpu> <key> <value...>" per GPU. */
static void parse_line(char *line) {
    char key[64];
    int gpu, used = 0;
    rstrip(line);
    if (!line[0] || line[0] == '#') return;
    if (sscanf(line, "%d %63s %n", &gpu, key, &used) < 2) {
        char value[80] = "";
        if (sscanf(line, "%63s %79[^\n]", key, value) < 1) return;
        if (!strcmp(key, "init")) init_code = atoi(value);
        else if (!strcmp(key, "driver")) snprintf(driver_version, sizeof(driver_version), "%s", value);
        else if (!strcmp(key, "nvml")) snprintf(nvml_version, sizeof(nvml_version), "%s", value);
        else if (!strcmp(key, "cuda")) cuda_version = atoi(value);
        else if (!strcmp(key, "count")) gpu_count = atoi(value) > MAX_GPUS ? MAX_GPUS : atoi(value);
        return;
    }
    if (gpu < 0 || gpu >= MAX_GPUS) return;
    struct nvmlDevice_st *g = &gpus[gpu];
    char *rest = line + used;
    char word[72];
    unsigned long long a = 0, b = 0, c = 0, d = 0;
    int code = 0;
    if (!strcmp(key, "name")) snprintf(g->name, sizeof(g->name), "%s", rest);
    else if (!strcmp(key, "uuid")) snprintf(g->uuid, sizeof(g->uuid), "%s", rest);
    else if (!strcmp(key, "bus")) snprintf(g->bus, sizeof(g->bus), "%s", rest);
    else if (!strcmp(key, "vbios")) snprintf(g->vbios, sizeof(g->vbios), "%s", rest);
    else if (!strcmp(key, "minor")) g->minor = (unsigned int)atoi(rest);
    else if (!strcmp(key, "lost") && sscanf(rest, "%d %71s", &code, word) == 2) {
        g->lost_code = code;
        snprintf(g->lost_from, sizeof(g->lost_from), "%s", word);
    }
    else if (!strcmp(key, "err") && sscanf(rest, "%71s %d", word, &code) == 2 && g->nerrs < MAX_ERRS) {
        snprintf(g->errs[g->nerrs].fn, sizeof(g->errs[0].fn), "%s", word);
        g->errs[g->nerrs++].code = code;
    }
    else if (!strcmp(key, "hang") && g->nhang < 4) snprintf(g->hang_fn[g->nhang++], sizeof(g->hang_fn[0]), "%s", rest);
    else if (!strcmp(key, "ecc_mode")) sscanf(rest, "%u %u", &g->ecc_cur, &g->ecc_pend);
    else if (!strcmp(key, "ecc") && sscanf(rest, "%llu %llu %llu", &a, &b, &c) == 3 && a < 2 && b < 2) g->ecc[a][b] = c;
    else if (!strcmp(key, "eccerr") && sscanf(rest, "%llu %llu %d", &a, &b, &code) == 3 && a < 2 && b < 2)
        g->ecc_err[a][b] = code;
    else if (!strcmp(key, "remap")) sscanf(rest, "%u %u %u %u", &g->remap[0], &g->remap[1], &g->remap[2], &g->remap[3]);
    else if (!strcmp(key, "retired")) sscanf(rest, "%u %u %u", &g->retired[0], &g->retired[1], &g->retired_pending);
    else if (!strcmp(key, "inforom")) g->inforom_valid = atoi(rest);
    else if (!strcmp(key, "temp")) g->temp = (unsigned int)atoi(rest);
    else if (!strcmp(key, "thr") && sscanf(rest, "%llu %llu", &a, &b) == 2 && a < 8) g->thr[a] = (unsigned int)b;
    else if (!strcmp(key, "threrr") && sscanf(rest, "%llu %d", &a, &code) == 2 && a < 8) g->thr_err[a] = code;
    else if (!strcmp(key, "reasons")) g->reasons = strtoull(rest, NULL, 0);
    else if (!strcmp(key, "util")) sscanf(rest, "%u %u", &g->util_gpu, &g->util_mem);
    else if (!strcmp(key, "power_limit")) g->power_limit = (unsigned int)atoi(rest);
    else if (!strcmp(key, "power_default")) g->power_default = (unsigned int)atoi(rest);
    else if (!strcmp(key, "power_usage")) g->power_usage = (unsigned int)atoi(rest);
    else if (!strcmp(key, "pcie"))
        sscanf(rest, "%u %u %u %u", &g->pcie_width, &g->pcie_max_width, &g->pcie_gen, &g->pcie_max_gen);
    else if (!strcmp(key, "compute_mode")) g->compute_mode = (unsigned int)atoi(rest);
    else if (!strcmp(key, "persistence")) g->persistence = (unsigned int)atoi(rest);
    else if (!strcmp(key, "mig")) sscanf(rest, "%u %u", &g->mig_cur, &g->mig_pend);
    else if (!strcmp(key, "fabric")) sscanf(rest, "%u %u", &g->fabric_state, &g->fabric_status);
    else if (!strcmp(key, "nvlink")) {
        int n = 0, consumed = 0;
        unsigned int state;
        while (n < NVML_NVLINK_MAX_LINKS && sscanf(rest, "%u%n", &state, &consumed) == 1) {
            g->links[n++] = state;
            rest += consumed;
        }
        g->nlinks = n;
    }
    else if (!strcmp(key, "memory")) sscanf(rest, "%llu %llu %llu", &g->mem_total, &g->mem_used, &g->mem_reserved);
    else if (!strcmp(key, "memory_v1")) {
        sscanf(rest, "%llu %llu", &g->mem_total, &g->mem_used);
        g->mem_v1_only = 1;
    }
    else if (!strcmp(key, "proc") && g->nprocs < MAX_PROCS && sscanf(rest, "%71s %llu %llu", word, &a, &b) == 3) {
        int kind = !strcmp(word, "compute") ? 0 : !strcmp(word, "graphics") ? 1 : 2;
        g->procs[g->nprocs++] = (proc_t){kind, (unsigned int)a, b};
    }
    else if (!strcmp(key, "viol") && sscanf(rest, "%llu %llu %llu", &a, &b, &c) >= 2 && a < 2) {
        g->viol[a] = b;
        g->viol_later[a] = sscanf(rest, "%llu %llu %llu", &a, &b, &c) == 3 ? c : NO_LATER;
    }
    else if (!strcmp(key, "violerr") && sscanf(rest, "%llu %d", &a, &code) == 2 && a < 2) g->viol_err[a] = code;
    else if (!strcmp(key, "field") && sscanf(rest, "%71s %llu", word, &d) == 2) set_field(g, field_id(word), 0, d);
    else if (!strcmp(key, "fielderr") && sscanf(rest, "%71s %d", word, &code) == 2)
        set_field(g, field_id(word), code, 0);
    else if (!strcmp(key, "cc")) sscanf(rest, "%d %d", &g->cc_major, &g->cc_minor);
}

static nvmlReturn_t load_scenario(void) {
    const char *path = getenv("RGT_FAKE_NVML_SCENARIO");
    if (!path || !*path) {
        fprintf(stderr, "fake libnvidia-ml: RGT_FAKE_NVML_SCENARIO is not set\n");
        return NVML_ERROR_UNKNOWN;
    }
    FILE *file = fopen(path, "r");
    if (!file) {
        fprintf(stderr, "fake libnvidia-ml: cannot read %s\n", path);
        return NVML_ERROR_UNKNOWN;
    }
    memset(gpus, 0, sizeof(gpus));
    init_code = NVML_SUCCESS;
    gpu_count = 0;
    for (int i = 0; i < MAX_GPUS; i++) {
        gpus[i].index = i;
        gpus[i].inforom_valid = 1;
        gpus[i].viol_later[0] = gpus[i].viol_later[1] = NO_LATER;
        gpus[i].cc_major = 9;
    }
    char line[512];
    while (fgets(line, sizeof(line), file)) parse_line(line);
    fclose(file);
    parse_fault();
    return NVML_SUCCESS;
}

static int error_for(const struct nvmlDevice_st *g, const char *fn) {
    for (int i = 0; i < g->nerrs; i++)
        if (!strcmp(g->errs[i].fn, fn)) return g->errs[i].code;
    return NVML_SUCCESS;
}

static int valid_handle(nvmlDevice_t device) {
    return device >= &gpus[0] && device < &gpus[gpu_count];
}

/* What every device call does first: initialised? a handle of ours? a fault, a hang, a lost GPU,
 * or an error the scenario gives this call? */
static nvmlReturn_t enter(const char *fn, nvmlDevice_t device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!valid_handle(device)) return NVML_ERROR_INVALID_ARGUMENT;
    maybe_fault(fn, device->index);
    for (int i = 0; i < device->nhang; i++)
        if (!strcmp(device->hang_fn[i], fn)) hang();
    if (device->lost_code && !strcmp(device->lost_from, fn)) device->lost = device->lost_code;
    if (device->lost) return (nvmlReturn_t)device->lost;
    return (nvmlReturn_t)error_for(device, fn);
}

#define ENTER(fn, device)                          \
    do {                                           \
        nvmlReturn_t entered_ = enter(fn, device); \
        if (entered_ != NVML_SUCCESS) return entered_; \
    } while (0)

static nvmlReturn_t copy_text(char *out, unsigned int length, const char *text) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

/* ---- system ---------------------------------------------------------------------------------- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    if (!initialized) { /* read afresh on every attempt, so a test can "load the driver" between retries */
        nvmlReturn_t ret = load_scenario();
        if (ret != NVML_SUCCESS) return ret;
    }
    maybe_fault("nvmlInitWithFlags", -1);
    if (init_code != NVML_SUCCESS) return (nvmlReturn_t)init_code;
    initialized = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    initialized = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Version mismatch between passed argument and API version";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    return copy_text(version, length, driver_version);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    return copy_text(version, length, nvml_version);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!cudaDriverVersion) return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = cuda_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!deviceCount) return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = (unsigned int)gpu_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (index >= (unsigned int)gpu_count || !device) return NVML_ERROR_INVALID_ARGUMENT;
    maybe_fault("nvmlDeviceGetHandleByIndex_v2", (int)index);
    if (gpus[index].lost_code && !strcmp(gpus[index].lost_from, "nvmlDeviceGetHandleByIndex_v2"))
        gpus[index].lost = gpus[index].lost_code;
    if (gpus[index].lost) return (nvmlReturn_t)gpus[index].lost;
    int code = error_for(&gpus[index], "nvmlDeviceGetHandleByIndex_v2");
    if (code != NVML_SUCCESS) return (nvmlReturn_t)code;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

/* ---- identity -------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    ENTER("nvmlDeviceGetName", device);
    return copy_text(name, length, device->name);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    ENTER("nvmlDeviceGetUUID", device);
    return copy_text(uuid, length, device->uuid);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    ENTER("nvmlDeviceGetPciInfo_v3", device);
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof(*pci));
    snprintf(pci->busId, sizeof(pci->busId), "%s", device->bus);
    unsigned int domain = 0, bus = 0, dev = 0;
    sscanf(device->bus, "%x:%x:%x", &domain, &bus, &dev);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04x:%02x:%02x.0", domain & 0xffff, bus & 0xff, dev & 0x1f);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = 0x233010de; /* H100 SXM5 80GB */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char *version, unsigned int length) {
    ENTER("nvmlDeviceGetVbiosVersion", device);
    return copy_text(version, length, device->vbios);
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    ENTER("nvmlDeviceGetCudaComputeCapability", device);
    if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    *major = device->cc_major;
    *minor = device->cc_minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values) {
    ENTER("nvmlDeviceGetFieldValues", device);
    if (!values || valuesCount < 0) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *value = &values[i];
        value->timestamp = 1700000000000000LL;
        value->latencyUsec = 0;
        value->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        for (int f = 0; f < device->nfields; f++) {
            if (device->fields[f].id != value->fieldId || value->fieldId == 0) continue;
            value->nvmlReturn = (nvmlReturn_t)device->fields[f].ret;
            if (value->fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) {
                value->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
                value->value.uiVal = (unsigned int)device->fields[f].value;
            } else {
                value->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
                value->value.ullVal = device->fields[f].value;
            }
        }
    }
    return NVML_SUCCESS;
}

/* ---- memory health --------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current, nvmlEnableState_t *pending) {
    ENTER("nvmlDeviceGetEccMode", device);
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    *current = (nvmlEnableState_t)device->ecc_cur;
    *pending = (nvmlEnableState_t)device->ecc_pend;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                         nvmlEccCounterType_t counterType, unsigned long long *eccCounts) {
    ENTER("nvmlDeviceGetTotalEccErrors", device);
    if (!eccCounts || (unsigned int)errorType > 1 || (unsigned int)counterType > 1) return NVML_ERROR_INVALID_ARGUMENT;
    if (device->ecc_err[errorType][counterType]) return (nvmlReturn_t)device->ecc_err[errorType][counterType];
    *eccCounts = device->ecc[errorType][counterType];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                       unsigned int *isPending, unsigned int *failureOccurred) {
    ENTER("nvmlDeviceGetRemappedRows", device);
    if (!corrRows || !uncRows || !isPending || !failureOccurred) return NVML_ERROR_INVALID_ARGUMENT;
    *corrRows = device->remap[0];
    *uncRows = device->remap[1];
    *isPending = device->remap[2];
    *failureOccurred = device->remap[3];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, nvmlPageRetirementCause_t cause, unsigned int *pageCount,
                                       unsigned long long *addresses) {
    ENTER("nvmlDeviceGetRetiredPages", device);
    if (!pageCount || (unsigned int)cause > 1) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int have = device->retired[cause];
    if (!addresses || *pageCount < have) {
        int enough = *pageCount >= have;
        *pageCount = have;
        return enough ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < have; i++) addresses[i] = 0x100000ull * (i + 1) + cause;
    *pageCount = have;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending) {
    ENTER("nvmlDeviceGetRetiredPagesPendingStatus", device);
    if (!isPending) return NVML_ERROR_INVALID_ARGUMENT;
    *isPending = (nvmlEnableState_t)device->retired_pending;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceValidateInforom(nvmlDevice_t device) {
    ENTER("nvmlDeviceValidateInforom", device);
    return device->inforom_valid ? NVML_SUCCESS : NVML_ERROR_CORRUPTED_INFOROM;
}

/* ---- thermal, power, PCIe -------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp) {
    ENTER("nvmlDeviceGetTemperature", device);
    if (!temp || sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    *temp = device->temp;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, nvmlTemperatureThresholds_t thresholdType,
                                               unsigned int *temp) {
    ENTER("nvmlDeviceGetTemperatureThreshold", device);
    if (!temp || (unsigned int)thresholdType >= 8) return NVML_ERROR_INVALID_ARGUMENT;
    if (device->thr_err[thresholdType]) return (nvmlReturn_t)device->thr_err[thresholdType];
    if (!device->thr[thresholdType]) return NVML_ERROR_NOT_SUPPORTED;
    *temp = device->thr[thresholdType];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons) {
    ENTER("nvmlDeviceGetCurrentClocksEventReasons", device);
    if (!reasons) return NVML_ERROR_INVALID_ARGUMENT;
    *reasons = device->reasons;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons) {
    ENTER("nvmlDeviceGetCurrentClocksThrottleReasons", device);
    if (!reasons) return NVML_ERROR_INVALID_ARGUMENT;
    *reasons = device->reasons;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    ENTER("nvmlDeviceGetUtilizationRates", device);
    if (!utilization) return NVML_ERROR_INVALID_ARGUMENT;
    utilization->gpu = device->util_gpu;
    utilization->memory = device->util_mem;
    return NVML_SUCCESS;
}

/* The one-unsigned-int getters: (device, unsigned int *out). */
#define UINT_GETTER(symbol, member)                                 \
    nvmlReturn_t symbol(nvmlDevice_t device, unsigned int *out) {   \
        ENTER(#symbol, device);                                     \
        if (!out) return NVML_ERROR_INVALID_ARGUMENT;               \
        *out = device->member;                                      \
        return NVML_SUCCESS;                                        \
    }

UINT_GETTER(nvmlDeviceGetEnforcedPowerLimit, power_limit)
UINT_GETTER(nvmlDeviceGetPowerManagementDefaultLimit, power_default)
UINT_GETTER(nvmlDeviceGetPowerUsage, power_usage)
UINT_GETTER(nvmlDeviceGetCurrPcieLinkWidth, pcie_width)
UINT_GETTER(nvmlDeviceGetMaxPcieLinkWidth, pcie_max_width)
UINT_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, pcie_gen)
UINT_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, pcie_max_gen)
UINT_GETTER(nvmlDeviceGetMinorNumber, minor)

nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t device, nvmlPerfPolicyType_t perfPolicyType,
                                          nvmlViolationTime_t *violTime) {
    ENTER("nvmlDeviceGetViolationStatus", device);
    if (!violTime || (unsigned int)perfPolicyType > 1) return NVML_ERROR_INVALID_ARGUMENT;
    if (device->viol_err[perfPolicyType]) return (nvmlReturn_t)device->viol_err[perfPolicyType];
    int later = device->viol_reads[perfPolicyType]++ > 0 && device->viol_later[perfPolicyType] != NO_LATER;
    violTime->referenceTime = 1700000000000000ull;
    violTime->violationTime = later ? device->viol_later[perfPolicyType] : device->viol[perfPolicyType];
    return NVML_SUCCESS;
}

/* ---- modes ----------------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode) {
    ENTER("nvmlDeviceGetComputeMode", device);
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    *mode = (nvmlComputeMode_t)device->compute_mode;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode) {
    ENTER("nvmlDeviceGetPersistenceMode", device);
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    *mode = (nvmlEnableState_t)device->persistence;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    ENTER("nvmlDeviceGetMigMode", device);
    if (!currentMode || !pendingMode) return NVML_ERROR_INVALID_ARGUMENT;
    *currentMode = device->mig_cur;
    *pendingMode = device->mig_pend;
    return NVML_SUCCESS;
}

/* Fabric fields are written over garbage padding (see the top of this file). */
#define FILL_FABRIC(info, device)                                   \
    do {                                                            \
        memset((char *)(info) + sizeof(unsigned int), 0xAB, sizeof(*(info)) - sizeof(unsigned int)); \
        memset((info)->clusterUuid, 0x11, NVML_GPU_FABRIC_UUID_LEN); \
        (info)->status = (nvmlReturn_t)(device)->fabric_status;     \
        (info)->cliqueId = 7;                                       \
        (info)->state = (nvmlGpuFabricState_t)(device)->fabric_state; \
        (info)->healthMask = 0;                                     \
    } while (0)

nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *gpuFabricInfo) {
    ENTER("nvmlDeviceGetGpuFabricInfoV", device);
    if (!gpuFabricInfo) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int version = gpuFabricInfo->version; /* a struct passed by value: this pointer is garbage */
    if (version == nvmlGpuFabricInfo_v2) {
        nvmlGpuFabricInfo_v2_t *info = (nvmlGpuFabricInfo_v2_t *)gpuFabricInfo;
        FILL_FABRIC(info, device);
        return NVML_SUCCESS;
    }
    if (version == nvmlGpuFabricInfo_v3) {
        nvmlGpuFabricInfo_v3_t *info = gpuFabricInfo;
        FILL_FABRIC(info, device);
        info->healthSummary = 0;
        return NVML_SUCCESS;
    }
    return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *gpuFabricInfo) {
    ENTER("nvmlDeviceGetGpuFabricInfo", device);
    if (!gpuFabricInfo) return NVML_ERROR_INVALID_ARGUMENT;
    memset(gpuFabricInfo, 0xAB, sizeof(*gpuFabricInfo));
    memset(gpuFabricInfo->clusterUuid, 0x11, NVML_GPU_FABRIC_UUID_LEN);
    gpuFabricInfo->status = (nvmlReturn_t)device->fabric_status;
    gpuFabricInfo->cliqueId = 7;
    gpuFabricInfo->state = (nvmlGpuFabricState_t)device->fabric_state;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive) {
    ENTER("nvmlDeviceGetNvLinkState", device);
    if (!isActive) return NVML_ERROR_INVALID_ARGUMENT;
    if (device->nlinks == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned int)device->nlinks) return NVML_ERROR_INVALID_ARGUMENT;
    *isActive = (nvmlEnableState_t)device->links[link];
    return NVML_SUCCESS;
}

/* ---- memory and processes -------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    ENTER("nvmlDeviceGetMemoryInfo", device);
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long used = device->mem_used + (device->mem_v1_only ? 0 : device->mem_reserved);
    memory->total = device->mem_total;
    memory->used = used;
    memory->free = device->mem_total - used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    ENTER("nvmlDeviceGetMemoryInfo_v2", device);
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (device->mem_v1_only) return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = device->mem_total;
    memory->reserved = device->mem_reserved;
    memory->used = device->mem_used;
    memory->free = device->mem_total - device->mem_used - device->mem_reserved;
    return NVML_SUCCESS;
}

/* NVML's two-call protocol: a count with infos NULL (or too small) answers INSUFFICIENT_SIZE. */
static nvmlReturn_t list_procs(nvmlDevice_t device, int kind, unsigned int *infoCount, nvmlProcessInfo_t *infos) {
    if (!infoCount) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int have = 0;
    for (int i = 0; i < device->nprocs; i++) have += device->procs[i].kind == kind;
    if (have == 0) {
        *infoCount = 0;
        return NVML_SUCCESS;
    }
    if (!infos || *infoCount < have) {
        *infoCount = have;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned int n = 0;
    for (int i = 0; i < device->nprocs; i++) {
        if (device->procs[i].kind != kind) continue;
        infos[n].pid = device->procs[i].pid;
        infos[n].usedGpuMemory = device->procs[i].used;
        infos[n].gpuInstanceId = 0xFFFFFFFF;
        infos[n].computeInstanceId = 0xFFFFFFFF;
        n++;
    }
    *infoCount = n;
    return NVML_SUCCESS;
}

#define PROC_LIST(symbol, kind)                                                                    \
    nvmlReturn_t symbol(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos) { \
        ENTER(#symbol, device);                                                                    \
        return list_procs(device, kind, infoCount, infos);                                        \
    }

PROC_LIST(nvmlDeviceGetComputeRunningProcesses_v3, 0)
PROC_LIST(nvmlDeviceGetComputeRunningProcesses_v2, 0)
PROC_LIST(nvmlDeviceGetGraphicsRunningProcesses_v3, 1)
PROC_LIST(nvmlDeviceGetGraphicsRunningProcesses_v2, 1)
PROC_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v3, 2)
PROC_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v2, 2)
