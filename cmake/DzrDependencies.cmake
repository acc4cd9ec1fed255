# Finds dzr's dependencies and exposes them as a few interface targets:
#   dzr::yaml  dzr::blas  dzr::sentencepiece  dzr::opencv (when DZR_OPENCV)  dzr::cudnn (when DZR_CUDA)
# libpng (PNG::PNG, with zlib) for report images and OpenSSL::Crypto (SHA-256) when present.
find_package(CLI11 REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)

# yaml-cpp: Debian 12 ships 0.7 (target `yaml-cpp`), Ubuntu 24.04 ships 0.8 (`yaml-cpp::yaml-cpp`).
find_package(yaml-cpp REQUIRED)
add_library(dzr_yaml INTERFACE)
if(TARGET yaml-cpp::yaml-cpp)
    target_link_libraries(dzr_yaml INTERFACE yaml-cpp::yaml-cpp)
elseif(TARGET yaml-cpp)
    target_link_libraries(dzr_yaml INTERFACE yaml-cpp)
else()
    message(FATAL_ERROR "yaml-cpp found but neither yaml-cpp::yaml-cpp nor yaml-cpp is a target")
endif()
add_library(dzr::yaml ALIAS dzr_yaml)

# CPU GEMM: OpenBLAS (cblas_sgemm).
find_path(DZR_CBLAS_INCLUDE cblas.h PATH_SUFFIXES openblas openblas-pthread)
find_library(DZR_OPENBLAS_LIB NAMES openblas openblas_pthread)
if(NOT DZR_CBLAS_INCLUDE OR NOT DZR_OPENBLAS_LIB)
    message(FATAL_ERROR "OpenBLAS not found (Debian: apt-get install libopenblas-dev)")
endif()
add_library(dzr_blas INTERFACE)
target_include_directories(dzr_blas INTERFACE ${DZR_CBLAS_INCLUDE})
target_link_libraries(dzr_blas INTERFACE ${DZR_OPENBLAS_LIB})
add_library(dzr::blas ALIAS dzr_blas)

# OpenSSL's libcrypto: SHA-256 of checkpoint files (checksums.sha256) and of shard headers (run fingerprints).
# NOTE: optional: without it (the GPU machine's image has no headers) dzr hashes with its own portable SHA-256
# (lib/core/sha256.cpp), a few times slower on large files.
find_package(OpenSSL COMPONENTS Crypto)

# sentencepiece (umT5 tokenizer).
find_path(DZR_SPM_INCLUDE sentencepiece_processor.h)
find_library(DZR_SPM_LIB sentencepiece)
if(NOT DZR_SPM_INCLUDE OR NOT DZR_SPM_LIB)
    message(FATAL_ERROR "sentencepiece not found (Debian: apt-get install libsentencepiece-dev)")
endif()
add_library(dzr_sentencepiece INTERFACE)
target_include_directories(dzr_sentencepiece INTERFACE ${DZR_SPM_INCLUDE})
target_link_libraries(dzr_sentencepiece INTERFACE ${DZR_SPM_LIB})
add_library(dzr::sentencepiece ALIAS dzr_sentencepiece)

# libpng (PNG files: plots, frame strips); CMake's FindPNG also finds zlib.
# NOTE: optional, as on the GPU machine's image (no -dev package to install there): without it dzr writes no PNG
# files (the report's SVG plots cover the plots; the video frame strip is left out).
find_package(PNG 1.6.29)
if(NOT PNG_FOUND)
    message(WARNING "libpng 1.6.29 or newer not found (Debian/Ubuntu: apt-get install libpng-dev): PNG output disabled")
endif()

# OpenCV: the slim core/imgproc/imgcodecs/videoio -dev packages ship no CMake config, so link by name.
if(DZR_OPENCV)
    find_path(DZR_OPENCV_INCLUDE opencv2/core.hpp PATH_SUFFIXES opencv4)
    set(_cv_libs)
    foreach(_m core imgproc imgcodecs videoio)
        find_library(DZR_OPENCV_${_m} opencv_${_m})
        if(NOT DZR_OPENCV_${_m})
            message(FATAL_ERROR "opencv_${_m} not found (Debian: apt-get install libopencv-${_m}-dev), "
                                "or configure with -DDZR_OPENCV=OFF")
        endif()
        list(APPEND _cv_libs ${DZR_OPENCV_${_m}})
    endforeach()
    if(NOT DZR_OPENCV_INCLUDE)
        message(FATAL_ERROR "OpenCV headers not found, or configure with -DDZR_OPENCV=OFF")
    endif()
    add_library(dzr_opencv INTERFACE)
    target_include_directories(dzr_opencv INTERFACE ${DZR_OPENCV_INCLUDE})
    target_link_libraries(dzr_opencv INTERFACE ${_cv_libs})
    add_library(dzr::opencv ALIAS dzr_opencv)
endif()

# LeRobot datasets (lib/dataset/): Apache Arrow C++ with Parquet, and FFmpeg's libraries.
# NOTE: Debian 12 packages no Arrow; the pyarrow wheel ships libarrow/libparquet and their headers, so a system
# Arrow (ParquetConfig.cmake) is taken where there is one, else the wheel of DZR_PYTHON (scripts/setup.sh installs
# it). AUTO builds dataset support when both are found; ON requires them.
set(DZR_DATASETS AUTO CACHE STRING "Read LeRobot datasets (Arrow C++ and FFmpeg): AUTO, ON or OFF")
set(DZR_HAVE_DATASETS OFF)
if(NOT DZR_DATASETS STREQUAL "OFF")
    set(_dzr_ds_missing)
    find_package(PkgConfig QUIET)
    if(PKG_CONFIG_FOUND)
        pkg_check_modules(DZR_FFMPEG QUIET IMPORTED_TARGET libavformat libavcodec libswscale libavutil)
    endif()
    if(NOT DZR_FFMPEG_FOUND)
        list(APPEND _dzr_ds_missing "FFmpeg (Debian: apt-get install libavformat-dev libavcodec-dev libswscale-dev)")
    endif()
    add_library(dzr_arrow INTERFACE)
    find_package(Parquet CONFIG QUIET)
    if(TARGET Parquet::parquet_shared)
        target_link_libraries(dzr_arrow INTERFACE Parquet::parquet_shared)
        set(_dzr_arrow_from "system (${Parquet_DIR})")
    else()
        if(NOT DZR_PYTHON)
            find_program(DZR_PYTHON NAMES python3 python)
        endif()
        set(_pa_include "")
        if(DZR_PYTHON)
            execute_process(COMMAND ${DZR_PYTHON} -c "import pyarrow as p; print(p.get_include()); print(p.get_library_dirs()[0])"
                            OUTPUT_VARIABLE _pa_out RESULT_VARIABLE _pa_rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
            if(_pa_rc EQUAL 0)
                string(REPLACE "\n" ";" _pa_lines "${_pa_out}")
                list(GET _pa_lines 0 _pa_include)
                list(GET _pa_lines 1 _pa_libdir)
            endif()
        endif()
        # NOTE: the wheel ships only versioned names (libarrow.so.2600); link them by path, found by the RPATH
        file(GLOB _pa_arrow "${_pa_libdir}/libarrow.so.[0-9]*")
        file(GLOB _pa_parquet "${_pa_libdir}/libparquet.so.[0-9]*")
        if(_pa_include AND _pa_arrow AND _pa_parquet)
            list(GET _pa_arrow 0 _pa_arrow)
            list(GET _pa_parquet 0 _pa_parquet)
            target_include_directories(dzr_arrow SYSTEM INTERFACE ${_pa_include})
            target_link_libraries(dzr_arrow INTERFACE ${_pa_parquet} ${_pa_arrow})
            set(_dzr_arrow_from "the pyarrow wheel of ${DZR_PYTHON} (${_pa_libdir})")
        else()
            list(APPEND _dzr_ds_missing "Apache Arrow C++ (scripts/setup.sh installs the pyarrow wheel; or a system Arrow)")
        endif()
    endif()
    if(_dzr_ds_missing)
        list(JOIN _dzr_ds_missing "; " _msg)
        if(DZR_DATASETS STREQUAL "ON")
            message(FATAL_ERROR "DZR_DATASETS=ON but not found: ${_msg}")
        endif()
        message(WARNING "dzr: no LeRobot dataset support (not found: ${_msg})")
    else()
        set(DZR_HAVE_DATASETS ON)
        message(STATUS "dzr: LeRobot datasets: Arrow from ${_dzr_arrow_from}, FFmpeg ${DZR_FFMPEG_libavformat_VERSION}")
    endif()
endif()

# cuDNN: not part of CUDAToolkit's targets; its headers live beside CUDA's (Debian here) or under
# /usr/include/x86_64-linux-gnu (Ubuntu's packages on the GPU machine).
if(DZR_CUDA)
    find_path(DZR_CUDNN_INCLUDE cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include/x86_64-linux-gnu)
    find_library(DZR_CUDNN_LIB cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu)
    if(NOT DZR_CUDNN_INCLUDE OR NOT DZR_CUDNN_LIB)
        message(FATAL_ERROR "cuDNN 9 not found next to CUDA; configure with -DDZR_CUDA=OFF to build without CUDA")
    endif()
    add_library(dzr_cudnn INTERFACE)
    target_include_directories(dzr_cudnn INTERFACE ${DZR_CUDNN_INCLUDE})
    target_link_libraries(dzr_cudnn INTERFACE ${DZR_CUDNN_LIB})
    add_library(dzr::cudnn ALIAS dzr_cudnn)
endif()

find_package(doctest QUIET)
if(DZR_BUILD_TESTS AND NOT doctest_FOUND)
    message(FATAL_ERROR "doctest not found (Debian: apt-get install doctest-dev), or -DDZR_BUILD_TESTS=OFF")
endif()
