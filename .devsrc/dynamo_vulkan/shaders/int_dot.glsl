// Packed 4 x int8 dot products (SPV_KHR_integer_dot_product), for devices created with
// shaderIntegerDotProduct (kp patch 7; caps "integer_dot_product"). glslc of Debian 12
// has no GLSL built-ins for them, so they are declared as SPIR-V instructions.
// The including kernel enables GL_EXT_spirv_intrinsics at its top.
// SDOT4(a, b): signed a . signed b; SUDOT4(a, b): signed a . unsigned b.
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int gb_sdot4x8(uint a, uint b, spirv_literal int packed_format);
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4452)
int gb_sudot4x8(uint a, uint b, spirv_literal int packed_format);
#define SDOT4(a, b) gb_sdot4x8(a, b, 0)
#define SUDOT4(a, b) gb_sudot4x8(a, b, 0)
