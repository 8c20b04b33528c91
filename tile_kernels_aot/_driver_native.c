/* The runtime's hot path in C, for tile_kernels_aot._driver and tile_kernels_aot._plans: cuLaunchKernel without ctypes'
 * conversion of its eleven arguments (launch), and the whole replay of a simple launch plan (replay).
 *
 * An optional extension: the runtime works without it (ctypes makes the same driver call, _plans replays in Python,
 * slower), and it links nothing. Driver functions come as addresses, from the libcuda.so.1 that _driver.py opened:
 * cuLaunchKernel through bind() for launch(), and cuLaunchKernel, cuLaunchKernelEx and cuCtxGetCurrent in each plan's
 * launch steps for replay(). Launch attributes come as the bytes of the CUlaunchAttribute array that _launch.py builds
 * in ctypes; this file knows only the layout of CUlaunchConfig (cuda.h's, and _driver.py's ctypes one). A replay's
 * allocations and same-dtype views go through torch's AOTInductor C shim, whose functions come as addresses too, from
 * the libtorch_cpu that torch loaded (bind_shim, _torch_shim.py).
 * Built against Python's limited API, so one binary serves every CPython from 3.11 on.
 */
#define Py_LIMITED_API 0x030B0000
#include <Python.h>
#include <stdint.h>

#define MAX_TENSORS 64 /* tensors of one replayed call: its argument tensors and what it allocates */
#define MAX_PARAMS 64  /* arguments of one replayed kernel */
#define MAX_ATTRIBUTES 4  /* launch attributes of one replayed kernel */
#define MAX_DIMS 16  /* dims of a tensor allocated through torch's shim (_torch_shim.MAX_DIMS) or keyed in bytes */

typedef int (*launch_kernel_t)(void *f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x, unsigned block_y,
                               unsigned block_z, unsigned shared_bytes, void *stream, void **params, void **extra);
typedef int (*ctx_get_current_t)(void **ctx);

/* cuda.h's CUlaunchAttribute (an id, 4 bytes of padding, a 64-byte union of values whose members hold pointers) and
 * CUlaunchConfig, for cuLaunchKernelEx. */
struct launch_attribute {
    int id;
    char pad[4];
    union {
        char bytes[64];
        void *align;
    } value;
};
struct launch_config {
    unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes;
    void *stream;
    struct launch_attribute *attrs;
    unsigned num_attrs;
};
_Static_assert(sizeof(struct launch_attribute) == 72, "CUlaunchAttribute is 72 bytes");
_Static_assert(sizeof(struct launch_config) == 56, "CUlaunchConfig is 56 bytes");
typedef int (*launch_kernel_ex_t)(const struct launch_config *config, void *f, void **params, void **extra);

static launch_kernel_t launch_kernel;

static PyObject *bind(PyObject *module, PyObject *address) {
    void *p = PyLong_AsVoidPtr(address);
    if (p == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "bind: the address of cuLaunchKernel is 0");
        return NULL;
    }
    launch_kernel = (launch_kernel_t)p;
    Py_RETURN_NONE;
}

/* Three unsigned ints from a tuple (a grid or a block), each below 2**32. */
static int dims(PyObject *tuple, const char *what, unsigned out[3]) {
    if (!PyTuple_Check(tuple) || PyTuple_Size(tuple) != 3) {
        PyErr_Format(PyExc_TypeError, "launch: %s must be a tuple of 3 ints", what);
        return -1;
    }
    for (Py_ssize_t i = 0; i < 3; i++) {
        unsigned long v = PyLong_AsUnsignedLong(PyTuple_GetItem(tuple, i));
        if (v == (unsigned long)-1 && PyErr_Occurred())
            return -1;
        if (v > 0xffffffffUL) {
            PyErr_Format(PyExc_OverflowError, "launch: %s[%zd] = %lu does not fit 32 bits", what, i, v);
            return -1;
        }
        out[i] = (unsigned)v;
    }
    return 0;
}

/* launch(function, grid, block, shared_bytes, stream, params) -> CUresult
 * function (or None for a null one), stream and params are addresses (params: the void* array of the kernel's
 * arguments); grid and block are tuples of 3 ints. The CUresult is returned, not raised: _driver.py turns a failure
 * into its named error. */
static PyObject *launch(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "launch takes 6 arguments, got %zd", nargs);
        return NULL;
    }
    if (launch_kernel == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "launch: bind() was not called");
        return NULL;
    }
    unsigned grid[3], block[3];
    if (dims(args[1], "grid", grid) || dims(args[2], "block", block))
        return NULL;
    unsigned long shared_bytes = PyLong_AsUnsignedLong(args[3]);
    if (shared_bytes == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    void *function = args[0] == Py_None ? NULL : PyLong_AsVoidPtr(args[0]);  /* a null c_void_p's value is None */
    void *stream = PyLong_AsVoidPtr(args[4]);
    void **params = (void **)PyLong_AsVoidPtr(args[5]);
    if (PyErr_Occurred())
        return NULL;
    int code;
    Py_BEGIN_ALLOW_THREADS  /* as ctypes does: a full launch queue blocks here, not every other thread */
    code = launch_kernel(function, grid[0], grid[1], grid[2], block[0], block[1], block[2], (unsigned)shared_bytes, stream, params, NULL);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(code);
}

/* -- signatures ------------------------------------------------------------------------------------------------ */

/* Set once by the module's init: torch.Tensor and torch.dtype, the methods of a tensor a signature or a returned view
 * calls (torch.Tensor.stride, ...: the arguments keyed here are exactly torch.Tensor), the attribute names it reads. */
static PyObject *tensor_type, *dtype_type, *m_stride, *m_get_device, *m_data_ptr, *m_view, *m_as_strided, *str_dtype, *str_shape,
    *str_native;

/* -- argument tensors through torch's DLPack exchange API -------------------------------------------------------- */

/* dlpack.h's DLTensor and the head of its DLPackExchangeAPI (major version 1), which torch (2.10 on) gives as the
 * capsule torch.Tensor.__dlpack_c_exchange_api__: its dltensor_from_py_object_no_sync fills a DLTensor from a tensor
 * without a Python call (non-owning: shape and strides point into the tensor, valid while it lives). */
struct dl_tensor {
    void *data;
    int32_t device_type, device_id;
    int32_t ndim;
    uint8_t code, bits;
    uint16_t lanes;
    int64_t *shape, *strides;
    uint64_t byte_offset;
};
struct dl_exchange_api {
    uint32_t major, minor;
    void *prev_api, *managed_tensor_allocator, *managed_tensor_from_py_object_no_sync, *managed_tensor_to_py_object_no_sync;
    int (*dltensor_from_py_object_no_sync)(void *py_object, struct dl_tensor *out);
    void *current_work_stream;
};
_Static_assert(sizeof(struct dl_tensor) == 48, "DLTensor is 48 bytes");
enum { DL_CPU = 1, DL_CUDA = 2 };

static const struct dl_exchange_api *exchange;  /* NULL: argument tensors are read through torch's Python API */

/* bind_exchange(capsule): torch's DLPack exchange API, the capsule of torch.Tensor.__dlpack_c_exchange_api__, through
 * which a signature reads its tensors; bind_exchange(None) unbinds it. */
static PyObject *bind_exchange(PyObject *module, PyObject *capsule) {
    const struct dl_exchange_api *api = NULL;
    if (capsule != Py_None) {
        if (!(api = PyCapsule_GetPointer(capsule, "dlpack_exchange_api")))
            return NULL;
        if (api->major != 1 || api->dltensor_from_py_object_no_sync == NULL) {
            PyErr_Format(PyExc_ValueError, "bind_exchange: DLPack exchange API %u.%u, not 1.x with dltensor_from_py_object_no_sync",
                         api->major, api->minor);
            return NULL;
        }
    }
    exchange = api;
    Py_RETURN_NONE;
}

/* A tensor's entry in a signature's bytes: its device (-1 for the CPU, as get_device() says), number of dims and the
 * low bits of its data pointer, then its sizes and its strides. (Its dtype is its part of the signature's tuple.) */
struct tensor_key {
    int32_t device, ndim;
    uint64_t low;
};
#define KEY_BYTES (MAX_TENSORS * (sizeof(struct tensor_key) + 2 * MAX_DIMS * sizeof(int64_t)))

/* One replayed call's tensors by number (see _plans._Recorder): its argument tensors (borrowed), then what it allocates
 * (owned), with each one's data pointer and, for one allocated through torch's shim, its handle (else NULL) until the
 * call's views are made; bit i of `have` says whether number i holds a tensor yet. `key` holds the entries of the
 * argument tensors read through the exchange API, in order. */
struct call {
    PyObject *tensors[MAX_TENSORS];
    uintptr_t pointers[MAX_TENSORS];
    void *handles[MAX_TENSORS];
    uint64_t have;
    Py_ssize_t num_inputs;
    unsigned char key[KEY_BYTES];
    size_t key_size;
};

/* Whether `t` is read through the exchange API (its entry added to the call's key bytes, its data pointer in
 * `pointer`): 1, or 0 where it is not bound or does not serve the tensor (a dtype DLPack has no type for, a device
 * other than CPU or CUDA, more than MAX_DIMS dims). */
static int exchange_key(PyObject *t, struct call *call, uintptr_t *pointer) {
    struct dl_tensor d;
    if (exchange == NULL)
        return 0;
    if (exchange->dltensor_from_py_object_no_sync(t, &d)) {
        PyErr_Clear();
        return 0;
    }
    if (d.byte_offset || d.strides == NULL || (d.device_type != DL_CPU && d.device_type != DL_CUDA) || d.ndim < 0 || d.ndim > MAX_DIMS)
        return 0;
    *pointer = (uintptr_t)d.data;
    struct tensor_key head = {d.device_type == DL_CPU ? -1 : d.device_id, d.ndim, *pointer & 255};
    unsigned char *at = call->key + call->key_size;
    __builtin_memcpy(at, &head, sizeof head);
    __builtin_memcpy(at + sizeof head, d.shape, d.ndim * sizeof(int64_t));
    __builtin_memcpy(at + sizeof head + d.ndim * sizeof(int64_t), d.strides, d.ndim * sizeof(int64_t));
    call->key_size += sizeof head + 2 * d.ndim * sizeof(int64_t);
    return 1;
}

/* A tensor's data pointer; -1 with an exception set on failure. */
static int data_ptr(PyObject *tensor, uintptr_t *out) {
    PyObject *p = PyObject_CallFunctionObjArgs(m_data_ptr, tensor, NULL);
    if (p == NULL)
        return -1;
    *out = (uintptr_t)PyLong_AsUnsignedLongLong(p);
    Py_DECREF(p);
    return PyErr_Occurred() ? -1 : 0;
}

/* An argument tensor's part of the signature, the tensor and its data pointer put in `call`: its dtype where the
 * exchange API reads the rest (its entry in the key bytes), else (dtype, shape, stride(), get_device(), data_ptr() &
 * 255) through torch's Python API, as _plans._part makes it. NULL without an exception where the call has MAX_TENSORS
 * already. */
static PyObject *tensor_part(PyObject *t, struct call *call) {
    if (call->num_inputs == MAX_TENSORS)
        return NULL;
    uintptr_t *pointer = &call->pointers[call->num_inputs];
    PyObject *dtype = PyObject_GetAttr(t, str_dtype), *shape = NULL, *stride = NULL, *device = NULL, *low = NULL, *part = NULL;
    if (dtype != NULL && exchange_key(t, call, pointer))
        part = Py_NewRef(dtype);
    else if (dtype != NULL && (shape = PyObject_GetAttr(t, str_shape)) &&
             (stride = PyObject_CallFunctionObjArgs(m_stride, t, NULL)) && (device = PyObject_CallFunctionObjArgs(m_get_device, t, NULL)) &&
             !data_ptr(t, pointer) && (low = PyLong_FromLong((long)(*pointer & 255))))
        part = PyTuple_Pack(5, dtype, shape, stride, device, low);
    Py_XDECREF(dtype);
    Py_XDECREF(shape);
    Py_XDECREF(stride);
    Py_XDECREF(device);
    Py_XDECREF(low);
    if (part != NULL)
        call->tensors[call->num_inputs++] = t;
    return part;
}

/* Whether `v` is an argument a signature holds as its type and value (_plans._SCALARS). */
static int is_scalar(PyObject *v) {
    return PyLong_CheckExact(v) || PyBool_Check(v) || PyUnicode_CheckExact(v) || v == Py_None || (PyObject *)Py_TYPE(v) == dtype_type;
}

/* What _plans._part makes of an argument: a tensor's part, (type, value) of a scalar, (float, value, its sign) of a
 * float, (type, the items' parts) of a tuple or list; the tensors go into `call` in the order _part meets them. NULL
 * without an exception for anything else (a tensor subclass, another object: Python keys some of them). */
static PyObject *part_of(PyObject *v, struct call *call) {
    if ((PyObject *)Py_TYPE(v) == tensor_type)
        return tensor_part(v, call);
    if (is_scalar(v))
        return PyTuple_Pack(2, (PyObject *)Py_TYPE(v), v);
    if (PyFloat_CheckExact(v)) {  /* 0.0 and -0.0 are equal keys, not equal arguments */
        PyObject *sign = PyFloat_FromDouble(__builtin_copysign(1.0, PyFloat_AsDouble(v)));
        PyObject *part = sign ? PyTuple_Pack(3, (PyObject *)&PyFloat_Type, v, sign) : NULL;
        Py_XDECREF(sign);
        return part;
    }
    int is_list = PyList_CheckExact(v);
    if (!is_list && !PyTuple_CheckExact(v))
        return NULL;
    Py_ssize_t n = is_list ? PyList_Size(v) : PyTuple_Size(v);
    PyObject *parts = PyTuple_New(n), *part = NULL;
    for (Py_ssize_t i = 0; parts && i < n; i++) {
        PyObject *item = part_of(is_list ? PyList_GetItem(v, i) : PyTuple_GetItem(v, i), call);
        if (item == NULL)
            Py_CLEAR(parts);
        else
            PyTuple_SetItem(parts, i, item);
    }
    if (parts != NULL)
        part = PyTuple_Pack(2, (PyObject *)Py_TYPE(v), parts);
    Py_XDECREF(parts);
    return part;
}

/* The signature of a call with positional arguments `args` (a tuple) and keyword arguments `kwargs` (a dict, or NULL
 * for none): the SM count, the index-check switch, then for each positional argument a scalar's type and value, or
 * another argument's part (part_of), then for each keyword argument, in the call's order, its name and its part, and,
 * where the exchange API is bound, last the bytes of the entries of the tensors it read. Unbound, it is the tuple
 * _plans.signature makes; bound, two calls have equal signatures exactly where they have equal _plans.signature
 * tuples. `call` gets the argument tensors in order. NULL without an exception where an argument is of a kind this
 * does not key; NULL with one on an error. */
static PyObject *signature_of(PyObject *args, PyObject *kwargs, PyObject *num_sms, PyObject *checks, struct call *call) {
    Py_ssize_t nargs = PyTuple_Size(args), size = 2 + (kwargs ? 2 * PyDict_Size(kwargs) : 0) + (exchange != NULL);
    for (Py_ssize_t i = 0; i < nargs; i++)
        size += is_scalar(PyTuple_GetItem(args, i)) ? 2 : 1;
    call->num_inputs = 0;
    call->key_size = 0;
    PyObject *key = PyTuple_New(size);
    if (key == NULL)
        return NULL;
    Py_INCREF(num_sms);
    PyTuple_SetItem(key, 0, num_sms);
    Py_INCREF(checks);
    PyTuple_SetItem(key, 1, checks);
    Py_ssize_t at = 2;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        PyObject *v = PyTuple_GetItem(args, i), *part;
        if (is_scalar(v)) {
            PyObject *kind = (PyObject *)Py_TYPE(v);
            Py_INCREF(kind);
            PyTuple_SetItem(key, at++, kind);
            Py_INCREF(v);
            part = v;
        } else {
            part = part_of(v, call);
        }
        if (part == NULL) {
            Py_DECREF(key);
            return NULL;
        }
        PyTuple_SetItem(key, at++, part);
    }
    PyObject *name, *value;
    for (Py_ssize_t pos = 0; kwargs && PyDict_Next(kwargs, &pos, &name, &value);) {
        PyObject *part = part_of(value, call);
        if (part == NULL) {
            Py_DECREF(key);
            return NULL;
        }
        Py_INCREF(name);
        PyTuple_SetItem(key, at++, name);
        PyTuple_SetItem(key, at++, part);
    }
    call->have = call->num_inputs == 64 ? ~(uint64_t)0 : ((uint64_t)1 << call->num_inputs) - 1;
    if (exchange != NULL) {  /* the tensors' entries: the last item, bytes, which no argument's part is */
        PyObject *entries = PyBytes_FromStringAndSize((const char *)call->key, (Py_ssize_t)call->key_size);
        if (entries == NULL) {
            Py_DECREF(key);
            return NULL;
        }
        PyTuple_SetItem(key, at, entries);
    }
    return key;
}

/* signature(args, kwargs, num_sms, index_checks, tensors) -> the signature replay() looks up (signature_of), the
 * call's argument tensors appended to the list `tensors`; or None, nothing appended, where replay() leaves the call to
 * Python. */
static PyObject *signature(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyTuple_Check(args[0]) || !PyDict_Check(args[1]) || !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "signature takes a tuple of arguments, a dict of keyword arguments, the SM count, "
                                         "the index-check switch and a list for the tensors");
        return NULL;
    }
    struct call call;
    PyObject *key = signature_of(args[0], args[1], args[2], args[3], &call);
    if (key == NULL && !PyErr_Occurred())
        Py_RETURN_NONE;
    for (Py_ssize_t i = 0; key && i < call.num_inputs; i++)
        if (PyList_Append(args[4], call.tensors[i]))
            Py_CLEAR(key);
    return key;
}

/* -- allocations through torch's C shim (_torch_shim.py) ----------------------------------------------------- */

typedef int32_t (*empty_strided_t)(int64_t ndim, const int64_t *sizes, const int64_t *strides, int32_t dtype, int32_t device_type,
                                   int32_t device_index, void **tensor);
typedef int32_t (*of_tensor_t)(void *tensor);  /* aoti_torch_zero_, aoti_torch_delete_tensor_object */
typedef int32_t (*get_data_ptr_t)(void *tensor, void **data);
typedef int32_t (*reinterpret_t)(void *tensor, int64_t ndim, const int64_t *sizes, const int64_t *strides, int64_t offset, void **view);

static empty_strided_t shim_empty_strided;
static of_tensor_t shim_zero, shim_delete;
static get_data_ptr_t shim_get_data_ptr;
static reinterpret_t shim_reinterpret;
static PyObject *shim_steal;  /* torch._C._aoti.alloc_tensor_by_stealing_from_void_ptr: a capsule of a handle -> a tensor */

/* bind_shim(empty_strided, zero_, get_data_ptr, delete_tensor_object, _reinterpret_tensor, steal):
 * _torch_shim.functions(). */
static PyObject *bind_shim(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyCallable_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "bind_shim takes five addresses and a callable");
        return NULL;
    }
    void *p[5];
    for (int i = 0; i < 5; i++)
        if (!(p[i] = PyLong_AsVoidPtr(args[i]))) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "bind_shim: an address is 0");
            return NULL;
        }
    shim_empty_strided = (empty_strided_t)p[0];
    shim_zero = (of_tensor_t)p[1];
    shim_get_data_ptr = (get_data_ptr_t)p[2];
    shim_delete = (of_tensor_t)p[3];
    shim_reinterpret = (reinterpret_t)p[4];
    Py_XDECREF(shim_steal);
    shim_steal = Py_NewRef(args[5]);
    Py_RETURN_NONE;
}

/* The tensor of a handle (torch's shim's reference to it), a new reference; NULL without an exception on a failure. */
static PyObject *stolen(void *tensor) {
    PyObject *capsule = PyCapsule_New(tensor, NULL, NULL);
    PyObject *made = capsule ? PyObject_CallFunctionObjArgs(shim_steal, capsule, NULL) : NULL;
    Py_XDECREF(capsule);
    PyErr_Clear();  /* the caller leaves a failure to torch's Python API */
    return made;
}

/* A tensor allocated (and zeroed where asked) through the shim as `spec` (_torch_shim.allocation) says, with its data
 * pointer in `pointer` and its handle in `handle`, which the caller deletes. NULL without an exception where the shim
 * is not bound or fails (torch's Python API then allocates, and raises what torch raises); NULL with one for a
 * malformed spec. */
static PyObject *shim_allocate(PyObject *spec, uintptr_t *pointer, void **handle) {
    int64_t head[5], dims[2 * MAX_DIMS];  /* ndim, dtype, device type, device index, zero; sizes then strides */
    char *bytes;
    Py_ssize_t nbytes;
    if (shim_steal == NULL || PyBytes_AsStringAndSize(spec, &bytes, &nbytes))
        return NULL;
    if (nbytes >= 40)
        __builtin_memcpy(head, bytes, 40);
    if (nbytes < 40 || head[0] < 0 || head[0] > MAX_DIMS || nbytes != 8 * (5 + 2 * head[0])) {
        PyErr_SetString(PyExc_SystemError, "replay: an allocation's shim spec is not 5 + 2 * ndim int64s");
        return NULL;
    }
    __builtin_memcpy(dims, bytes + 40, 16 * head[0]);
    void *tensor = NULL, *data = NULL;
    int32_t code;
    Py_BEGIN_ALLOW_THREADS
    code = shim_empty_strided(head[0], dims, dims + head[0], (int32_t)head[1], (int32_t)head[2], (int32_t)head[3], &tensor);
    if (!code && head[4])
        code = shim_zero(tensor);
    if (!code)
        code = shim_get_data_ptr(tensor, &data);
    Py_END_ALLOW_THREADS
    PyObject *made = code ? NULL : stolen(tensor);
    if (made == NULL && tensor != NULL)
        shim_delete(tensor);
    *handle = made ? tensor : NULL;
    *pointer = (uintptr_t)data;
    return made;
}

/* -- replay ---------------------------------------------------------------------------------------------------- */

/* A tensor number of a plan that `call` holds (or, with `absent`, does not hold yet): 0, or -1 with an exception.
 * -1 (a launch step's number for an address) passes where `address` allows it. */
static int number_of(PyObject *item, const struct call *call, int absent, int address, Py_ssize_t *out) {
    Py_ssize_t n = PyLong_AsSsize_t(item);
    if (n == -1 && PyErr_Occurred())
        return -1;
    if (!(n == -1 && address) && (n < 0 || n >= MAX_TENSORS || (int)(call->have >> n & 1) == absent)) {
        PyErr_Format(PyExc_SystemError, "replay: the plan's tensor %zd is %s", n, absent ? "made twice" : "not made yet");
        return -1;
    }
    *out = n;
    return 0;
}

/* A launch step's items (_launch.py, LoadedKernel.native_steps). */
enum {
    STEP_LAUNCH, STEP_CTX_GET_CURRENT, STEP_LAUNCH_EX, STEP_CONTEXT, STEP_FUNCTION, STEP_GRID, STEP_BLOCK = STEP_GRID + 3,
    STEP_SHARED_BYTES = STEP_BLOCK + 3, STEP_STREAM, STEP_DEVICE, STEP_CHECK, STEP_ARGUMENTS, STEP_SLOTS, STEP_ATTRIBUTES, STEP_ITEMS
};

/* Whether the context a launch step recorded is this thread's current one: 1, 0, or -1 with an exception. */
static int same_context(PyObject *step) {
    if (!PyTuple_Check(step) || PyTuple_Size(step) != STEP_ITEMS) {
        PyErr_Format(PyExc_SystemError, "replay: a launch step is a tuple of %d", STEP_ITEMS);
        return -1;
    }
    ctx_get_current_t ctx_get_current = (ctx_get_current_t)PyLong_AsVoidPtr(PyTuple_GetItem(step, STEP_CTX_GET_CURRENT));
    void *recorded = PyLong_AsVoidPtr(PyTuple_GetItem(step, STEP_CONTEXT));
    if (PyErr_Occurred())
        return -1;
    void *current = NULL;
    return ctx_get_current(&current) == 0 && current == recorded;
}

/* One launch step (its layout: _launch.py, LoadedKernel.native_step): the scalar arguments read where the step keeps
 * them, the pointers filled in on the stack, the stream asked of torch, cuLaunchKernel called without the GIL (or, for a
 * step with launch attributes, cuLaunchKernelEx with its CUlaunchConfig and the attributes on the stack), and a failure
 * handed to the step's check (Driver.check, which raises the named CudaDriverError). 0, or -1 with an exception. */
static int launch_step(PyObject *step, const struct call *call) {
    void *function = PyLong_AsVoidPtr(PyTuple_GetItem(step, STEP_FUNCTION));
    unsigned long sizes[7];  /* grid, block, shared bytes */
    for (Py_ssize_t i = 0; i < 7; i++)
        sizes[i] = PyLong_AsUnsignedLong(PyTuple_GetItem(step, STEP_GRID + i));
    if (PyErr_Occurred())
        return -1;
    char *block, *attribute_bytes;  /* 8 bytes an argument; the attributes' array; the step holds both while this runs */
    Py_ssize_t nbytes, attribute_nbytes;
    if (PyBytes_AsStringAndSize(PyTuple_GetItem(step, STEP_ARGUMENTS), &block, &nbytes) ||
        PyBytes_AsStringAndSize(PyTuple_GetItem(step, STEP_ATTRIBUTES), &attribute_bytes, &attribute_nbytes))
        return -1;
    Py_ssize_t num_attrs = attribute_nbytes / (Py_ssize_t)sizeof(struct launch_attribute);
    if (attribute_nbytes % sizeof(struct launch_attribute) || num_attrs > MAX_ATTRIBUTES) {
        PyErr_SetString(PyExc_SystemError, "replay: a launch step's attributes are not up to MAX_ATTRIBUTES CUlaunchAttributes");
        return -1;
    }
    struct launch_attribute attrs[MAX_ATTRIBUTES];
    for (Py_ssize_t i = 0; i < num_attrs; i++)
        __builtin_memcpy(&attrs[i], attribute_bytes + i * sizeof(struct launch_attribute), sizeof(struct launch_attribute));
    Py_ssize_t nparams = nbytes / 8;
    if (nbytes % 8 || nparams > MAX_PARAMS) {
        PyErr_SetString(PyExc_SystemError, "replay: a launch step's argument block is not up to MAX_PARAMS 8-byte slots");
        return -1;
    }
    uint64_t pointers[MAX_PARAMS];
    void *params[MAX_PARAMS];
    for (Py_ssize_t i = 0; i < nparams; i++)
        params[i] = block + 8 * i;
    PyObject *slots = PyTuple_GetItem(step, STEP_SLOTS);  /* (slot, tensor number, byte offset), flat; number -1: the offset is the address */
    Py_ssize_t nslots = PyTuple_Size(slots);
    for (Py_ssize_t i = 0; i + 2 < nslots; i += 3) {
        Py_ssize_t slot = PyLong_AsSsize_t(PyTuple_GetItem(slots, i)), number;
        if (slot == -1 && PyErr_Occurred())
            return -1;
        if (slot < 0 || slot >= nparams) {
            PyErr_Format(PyExc_SystemError, "replay: pointer slot %zd of %zd", slot, nparams);
            return -1;
        }
        if (number_of(PyTuple_GetItem(slots, i + 1), call, 0, 1, &number))
            return -1;
        uint64_t offset = PyLong_AsUnsignedLongLong(PyTuple_GetItem(slots, i + 2));
        if (PyErr_Occurred())
            return -1;
        pointers[slot] = (number >= 0 ? call->pointers[number] : 0) + offset;
        params[slot] = &pointers[slot];
    }
    PyObject *stream_obj = PyObject_CallFunctionObjArgs(PyTuple_GetItem(step, STEP_STREAM), PyTuple_GetItem(step, STEP_DEVICE), NULL);
    if (stream_obj == NULL)
        return -1;
    void *stream = PyLong_AsVoidPtr(stream_obj);
    Py_DECREF(stream_obj);
    launch_kernel_t launch_fn = (launch_kernel_t)PyLong_AsVoidPtr(PyTuple_GetItem(step, STEP_LAUNCH));
    launch_kernel_ex_t launch_ex = (launch_kernel_ex_t)PyLong_AsVoidPtr(PyTuple_GetItem(step, STEP_LAUNCH_EX));
    if (PyErr_Occurred())
        return -1;
    struct launch_config config = {sizes[0], sizes[1], sizes[2], sizes[3], sizes[4], sizes[5], sizes[6], stream, attrs, num_attrs};
    int code;
    Py_BEGIN_ALLOW_THREADS
    if (num_attrs)
        code = launch_ex(&config, function, params, NULL);
    else
        code = launch_fn(function, sizes[0], sizes[1], sizes[2], sizes[3], sizes[4], sizes[5], sizes[6], stream, params, NULL);
    Py_END_ALLOW_THREADS
    if (code) {
        PyObject *checked = PyObject_CallFunction(PyTuple_GetItem(step, STEP_CHECK), "si", num_attrs ? "cuLaunchKernelEx" : "cuLaunchKernel", code);
        if (checked == NULL)
            return -1;
        Py_DECREF(checked);
    }
    return 0;
}

/* base.as_strided(shape, stride, offset) made by the shim's _reinterpret_tensor from the handle of `base`, an allocation
 * the shim made (a tensor of the same storage, sizes, strides and offset, but not an autograd view, as AOTInductor's
 * outputs are not). NULL without an exception where the shim cannot make it; with one for a shape or stride that is
 * not a tuple of ints. */
static PyObject *shim_view(void *base, PyObject *shape, PyObject *stride, PyObject *offset) {
    int64_t dims[2 * MAX_DIMS];  /* sizes, then strides */
    Py_ssize_t ndim = PyTuple_Size(shape);
    if (ndim < 0 || ndim > MAX_DIMS || PyTuple_Size(stride) != ndim) {
        PyErr_Clear();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < ndim; i++) {
        dims[i] = PyLong_AsLongLong(PyTuple_GetItem(shape, i));
        dims[ndim + i] = PyLong_AsLongLong(PyTuple_GetItem(stride, i));
    }
    int64_t start = PyLong_AsLongLong(offset);
    void *view = NULL;
    if (PyErr_Occurred() || shim_reinterpret(base, ndim, dims, dims + ndim, start, &view))
        return NULL;
    PyObject *made = stolen(view);
    shim_delete(view);
    return made;
}

/* A returned view (_plans._native_plan): (number, base number, dtype or None, shape, stride, offset) made as
 * base.view(dtype).as_strided(shape, stride, offset), or base.as_strided(...) without a dtype, as
 * _plans._Recorder._builder makes it: without a dtype, of a base the shim allocated, by the shim (shim_view), else
 * through the tensors' own methods. 0, or -1 with an exception. */
static int view_step(PyObject *step, struct call *call) {
    Py_ssize_t number, base;
    if (!PyTuple_Check(step) || PyTuple_Size(step) != 6) {
        PyErr_SetString(PyExc_SystemError, "replay: a returned view is a tuple of 6");
        return -1;
    }
    if (number_of(PyTuple_GetItem(step, 0), call, 1, 0, &number) || number_of(PyTuple_GetItem(step, 1), call, 0, 0, &base))
        return -1;
    PyObject *dtype = PyTuple_GetItem(step, 2), *retyped = NULL, *made = NULL;
    if (dtype == Py_None && call->handles[base] != NULL &&
        !(made = shim_view(call->handles[base], PyTuple_GetItem(step, 3), PyTuple_GetItem(step, 4), PyTuple_GetItem(step, 5))) &&
        PyErr_Occurred())
        return -1;
    if (made == NULL) {
        if (dtype != Py_None && !(retyped = PyObject_CallFunctionObjArgs(m_view, call->tensors[base], dtype, NULL)))
            return -1;
        made = PyObject_CallFunctionObjArgs(m_as_strided, retyped ? retyped : call->tensors[base], PyTuple_GetItem(step, 3),
                                           PyTuple_GetItem(step, 4), PyTuple_GetItem(step, 5), NULL);
        Py_XDECREF(retyped);
        if (made == NULL)
            return -1;
    }
    call->tensors[number] = made;
    call->have |= (uint64_t)1 << number;
    return 0;
}

/* A plan's result (_plans._Recorder._returns): a tensor's number, None, or a tuple or list of these. */
static PyObject *result_of(PyObject *spec, const struct call *call) {
    if (spec == Py_None)
        Py_RETURN_NONE;
    Py_ssize_t number;
    if (PyLong_Check(spec)) {
        if (number_of(spec, call, 0, 0, &number))
            return NULL;
        Py_INCREF(call->tensors[number]);
        return call->tensors[number];
    }
    int is_list = PyList_Check(spec);
    Py_ssize_t n = is_list ? PyList_Size(spec) : PyTuple_Size(spec);
    if (n < 0)
        return NULL;
    PyObject *result = is_list ? PyList_New(n) : PyTuple_New(n);
    for (Py_ssize_t i = 0; result && i < n; i++) {
        PyObject *item = result_of(is_list ? PyList_GetItem(spec, i) : PyTuple_GetItem(spec, i), call);
        if (item == NULL || (is_list ? PyList_SetItem(result, i, item) : PyTuple_SetItem(result, i, item)))
            Py_CLEAR(result);
    }
    return result;
}

/* Run a native plan (see _plans._native_plan) for `call`, whose argument tensors it holds: its allocations, its
 * launches, the views it returns, its result. NotImplemented, before anything is allocated, where a launch step's
 * context is not this thread's current one. */
static PyObject *run(PyObject *plan, struct call *call) {
    if (!PyTuple_Check(plan) || PyTuple_Size(plan) != 4) {
        PyErr_SetString(PyExc_SystemError, "replay: a native plan is a tuple of 4");
        return NULL;
    }
    PyObject *allocations = PyTuple_GetItem(plan, 0), *launches = PyTuple_GetItem(plan, 1), *views = PyTuple_GetItem(plan, 2), *result = NULL;
    Py_ssize_t num_allocations = PyTuple_Size(allocations), num_launches = PyTuple_Size(launches), num_views = PyTuple_Size(views);
    for (Py_ssize_t i = 0; i < num_launches; i++) {
        int same = same_context(PyTuple_GetItem(launches, i));
        if (same <= 0) {
            if (same < 0)
                return NULL;
            Py_RETURN_NOTIMPLEMENTED;
        }
    }
    uint64_t inputs = call->have;
    __builtin_memset(call->handles, 0, sizeof call->handles);
    for (Py_ssize_t i = 0; i < num_allocations; i++) {  /* (number, allocating method, its args, shim spec or None) */
        PyObject *step = PyTuple_GetItem(allocations, i), *spec;
        Py_ssize_t number;
        if (!PyTuple_Check(step) || PyTuple_Size(step) != 4) {
            PyErr_SetString(PyExc_SystemError, "replay: an allocation is a tuple of 4");
            goto done;
        }
        if (number_of(PyTuple_GetItem(step, 0), call, 1, 0, &number))
            goto done;
        spec = PyTuple_GetItem(step, 3);
        PyObject *made = spec == Py_None ? NULL : shim_allocate(spec, &call->pointers[number], &call->handles[number]);
        if (made == NULL) {
            if (PyErr_Occurred() || !(made = PyObject_Call(PyTuple_GetItem(step, 1), PyTuple_GetItem(step, 2), NULL)))
                goto done;
            if (data_ptr(made, &call->pointers[number])) {
                Py_DECREF(made);
                goto done;
            }
        }
        call->tensors[number] = made;
        call->have |= (uint64_t)1 << number;
    }
    for (Py_ssize_t i = 0; i < num_launches; i++)
        if (launch_step(PyTuple_GetItem(launches, i), call))
            goto done;
    for (Py_ssize_t i = 0; i < num_views; i++)
        if (view_step(PyTuple_GetItem(views, i), call))
            goto done;
    result = result_of(PyTuple_GetItem(plan, 3), call);
done:
    for (Py_ssize_t i = 0; i < MAX_TENSORS; i++) {
        if ((call->have & ~inputs) >> i & 1)
            Py_DECREF(call->tensors[i]);
        if (call->handles[i] != NULL)
            shim_delete(call->handles[i]);
    }
    return result;
}

/* replay(plans, args, kwargs, num_sms, index_checks, by_signature) -> the call's result, or NotImplemented
 * A launch plan's call (see _plans.launch_plan), its positional arguments a tuple and its keyword arguments a dict: its
 * signature, made as _plans.signature makes it, is looked up in `plans`; where that holds a plan with a native form
 * (_Plan.native), the plan runs here. Any other call with a signature goes to by_signature(signature, argument tensors,
 * args, kwargs), which Python's replay and the op's full call begin with, as does a native plan's where another CUDA
 * context is current (found before anything is allocated). NotImplemented, with nothing done, where an argument is of a
 * kind this does not key. */
static PyObject *replay(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyDict_Check(args[0]) || !PyTuple_Check(args[1]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "replay takes a dict of plans, a tuple of arguments, a dict of keyword arguments, the SM "
                                         "count, the index-check switch and the call by signature");
        return NULL;
    }
    struct call call;
    PyObject *key = signature_of(args[1], args[2], args[3], args[4], &call);
    if (key == NULL) {
        PyErr_Clear();  /* an argument without a signature here: Python keys it, or the op's own checks say what is wrong */
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *plan = PyDict_GetItemWithError(args[0], key);  /* borrowed: its native form is read at once */
    PyObject *native = plan == NULL || plan == Py_None ? NULL : PyObject_GetAttr(plan, str_native);
    if (PyErr_Occurred()) {  /* a key that does not hash, say: Python's path meets it again and runs the op */
        PyErr_Clear();
        Py_XDECREF(native);
        Py_DECREF(key);
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *result = native == NULL || native == Py_None ? Py_NewRef(Py_NotImplemented) : run(native, &call);
    Py_XDECREF(native);  /* held while it ran: another thread may drop the plan meanwhile */
    if (result == Py_NotImplemented) {
        Py_DECREF(result);
        PyObject *tensors = PyList_New(call.num_inputs);
        for (Py_ssize_t i = 0; tensors && i < call.num_inputs; i++) {
            Py_INCREF(call.tensors[i]);
            PyList_SetItem(tensors, i, call.tensors[i]);
        }
        result = tensors ? PyObject_CallFunctionObjArgs(args[5], key, tensors, args[1], args[2], NULL) : NULL;
        Py_XDECREF(tensors);
    }
    Py_DECREF(key);
    return result;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_O, "bind(address): the cuLaunchKernel that launch() calls."},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(function, grid, block, shared_bytes, stream, params) -> CUresult"},
    {"signature", (PyCFunction)(void (*)(void))signature, METH_FASTCALL,
     "signature(args, kwargs, num_sms, index_checks, tensors) -> the signature replay() looks up, or None"},
    {"bind_shim", (PyCFunction)(void (*)(void))bind_shim, METH_FASTCALL,
     "bind_shim(empty_strided, zero_, get_data_ptr, delete_tensor_object, _reinterpret_tensor, steal): torch's C shim, for "
     "replayed allocations and views."},
    {"bind_exchange", bind_exchange, METH_O,
     "bind_exchange(capsule): torch's DLPack exchange API, through which a signature reads its tensors; bind_exchange(None) "
     "unbinds it."},
    {"replay", (PyCFunction)(void (*)(void))replay, METH_FASTCALL,
     "replay(plans, args, kwargs, num_sms, index_checks, by_signature) -> the call's result, or NotImplemented where Python keys it"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "tile_kernels_aot._driver_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__driver_native(void) {
    PyObject *torch = PyImport_ImportModule("torch");
    if (torch == NULL)
        return NULL;
    tensor_type = PyObject_GetAttrString(torch, "Tensor");
    dtype_type = PyObject_GetAttrString(torch, "dtype");
    Py_DECREF(torch);
    if (tensor_type == NULL || dtype_type == NULL || !(m_stride = PyObject_GetAttrString(tensor_type, "stride")) ||
        !(m_get_device = PyObject_GetAttrString(tensor_type, "get_device")) || !(m_data_ptr = PyObject_GetAttrString(tensor_type, "data_ptr")) ||
        !(m_view = PyObject_GetAttrString(tensor_type, "view")) || !(m_as_strided = PyObject_GetAttrString(tensor_type, "as_strided")) ||
        !(str_dtype = PyUnicode_InternFromString("dtype")) || !(str_shape = PyUnicode_InternFromString("shape")) ||
        !(str_native = PyUnicode_InternFromString("native")))
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL || PyModule_AddIntConstant(module, "MAX_TENSORS", MAX_TENSORS) || PyModule_AddIntConstant(module, "MAX_PARAMS", MAX_PARAMS) ||
        PyModule_AddIntConstant(module, "MAX_DIMS", MAX_DIMS)) {
        Py_XDECREF(module);
        return NULL;
    }
    return module;
}
