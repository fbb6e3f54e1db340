// Programmatic Dependent Launch's deferred wait (polykit/kernels/cuda/pdl.py): a kernel whose body starts with
// PK_PDL_DEFER(); reads only plan weights until it calls PK_PDL_WAIT(); (griddepcontrol.wait, then the trigger).
// A source rendered with PDL gets both from pdl.PREAMBLE; rendered without, they are no-ops.
#pragma once
#ifndef PK_PDL_WAIT
#define PK_PDL_WAIT() do { } while (0)
#define PK_PDL_DEFER() do { } while (0)
#endif
