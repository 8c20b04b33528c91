/* cuLaunchKernel for tile_kernels_aot._driver, without ctypes' conversion of its eleven arguments.
 *
 * An optional extension: the runtime works without it (ctypes makes the same call, slower), and it links nothing.
 * The driver's cuLaunchKernel comes as an address, from the libcuda.so.1 that _driver.py opened, through bind().
 * Built against Python's limited API, so one binary serves every CPython from 3.11 on.
 */
#define Py_LIMITED_API 0x030B0000
#include <Python.h>

typedef int (*launch_kernel_t)(void *f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x, unsigned block_y,
                               unsigned block_z, unsigned shared_bytes, void *stream, void **params, void **extra);

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

static PyMethodDef methods[] = {
    {"bind", bind, METH_O, "bind(address): the cuLaunchKernel that launch() calls."},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(function, grid, block, shared_bytes, stream, params) -> CUresult"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "tile_kernels_aot._driver_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__driver_native(void) { return PyModule_Create(&module_def); }
