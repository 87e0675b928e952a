//! The routes of the five named collections. One macro stamps out, per resource, six thin handlers with their
//! OpenAPI annotations (utoipa needs a concrete function per operation) and the router mounting them; all
//! behaviour lives in the generic functions of `crud.rs`. The answers every write with a body can give (400, 413,
//! 415, 422) are added to the document in `document.rs`, once for all.

use axum::Json;
use axum::extract::{Extension, Path, Query, State};
use axum::response::Response;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::body::BodyWrite;
use super::crud::{self, Page, PageQuery};
use super::error::{AdminError, Problem};
use super::{PROBLEM, Shared};
use crate::model::{Api, Certificate, Consumer, Spec, Upstream};
use crate::tokens::Principal;

macro_rules! collection {
    (
        $ty:ident,
        router: $router:ident,
        tag: $tag:literal,
        collection: $collection:literal,
        item: $item:literal,
        name: $name:literal,
        handlers: [$list:ident, $create:ident, $get:ident, $replace:ident, $patch:ident, $delete:ident] $(,)?
    ) => {
        #[utoipa::path(
            get, path = $collection, tag = $tag, params(PageQuery),
            responses(
                (status = 200, description = "One page, sorted by name", body = Page<$ty>),
            ),
        )]
        pub async fn $list(
            State(admin): State<Shared>,
            Query(query): Query<PageQuery>,
        ) -> Result<Json<Page<$ty>>, AdminError> {
            crud::list::<$ty>(&admin, query).await.map(Json)
        }

        #[utoipa::path(
            post, path = $collection, tag = $tag,
            request_body(content(($ty = "application/json"), ($ty = "application/yaml"))),
            responses(
                (status = 201, description = "Created; `Location` names it. Write-only fields are not returned.",
                    body = $ty, headers(("Location" = String), ("Sluice-Config-Version" = u64))),
                (status = 409, description = "The name is taken", body = Problem, content_type = PROBLEM),
            ),
        )]
        pub async fn $create(State(admin): State<Shared>, write: BodyWrite) -> Result<Response, AdminError> {
            crud::create::<$ty>(&admin, write).await
        }

        #[utoipa::path(
            get, path = $item, tag = $tag,
            params(("name" = String, Path, description = $name)),
            responses(
                (status = 200, description = "The resource; write-only fields are never returned", body = $ty),
                (status = 404, description = "No such name", body = Problem, content_type = PROBLEM),
            ),
        )]
        pub async fn $get(State(admin): State<Shared>, Path(name): Path<String>) -> Result<Json<$ty>, AdminError> {
            crud::get::<$ty>(&admin, &name).await.map(Json)
        }

        #[utoipa::path(
            put, path = $item, tag = $tag,
            params(("name" = String, Path, description = $name)),
            request_body(
                description = "The whole resource. Its name may be left out; if given it must equal the one in the URL \
                    (422 at `/name` otherwise).",
                content(($ty = "application/json"), ($ty = "application/yaml")),
            ),
            responses(
                (status = 200, description = "Replaced", body = $ty, headers(("Sluice-Config-Version" = u64))),
                (status = 201, description = "Created (PUT creates a missing name)", body = $ty,
                    headers(("Location" = String), ("Sluice-Config-Version" = u64))),
            ),
        )]
        pub async fn $replace(State(admin): State<Shared>, Path(name): Path<String>, write: BodyWrite) -> Result<Response, AdminError> {
            crud::replace::<$ty>(&admin, &name, write).await
        }

        #[utoipa::path(
            patch, path = $item, tag = $tag,
            params(("name" = String, Path, description = $name)),
            request_body(
                description = "RFC 7396 JSON merge patch: members replace, `null` removes, arrays are replaced whole. \
                    The result is validated like a PUT body.",
                content((Object = "application/merge-patch+json"), (Object = "application/json")),
            ),
            responses(
                (status = 200, description = "Patched", body = $ty, headers(("Sluice-Config-Version" = u64))),
                (status = 404, description = "No such name", body = Problem, content_type = PROBLEM),
            ),
        )]
        pub async fn $patch(State(admin): State<Shared>, Path(name): Path<String>, write: BodyWrite) -> Result<Response, AdminError> {
            crud::patch::<$ty>(&admin, &name, write).await
        }

        #[utoipa::path(
            delete, path = $item, tag = $tag,
            params(("name" = String, Path, description = $name)),
            responses(
                (status = 204, description = "Deleted", headers(("Sluice-Config-Version" = u64))),
                (status = 404, description = "No such name", body = Problem, content_type = PROBLEM),
                (status = 409, description = "Still referenced; `referrers` names who refers to it", body = Problem, content_type = PROBLEM),
            ),
        )]
        pub async fn $delete(
            State(admin): State<Shared>,
            Extension(principal): Extension<Principal>,
            Path(name): Path<String>,
        ) -> Result<Response, AdminError> {
            crud::delete::<$ty>(&admin, &principal.name, &name).await
        }

        pub fn $router() -> OpenApiRouter<Shared> {
            OpenApiRouter::new().routes(routes!($list, $create)).routes(routes!($get, $replace, $patch, $delete))
        }
    };
}

collection! {
    Api,
    router: apis,
    tag: "apis",
    collection: "/v1/apis",
    item: "/v1/apis/{name}",
    name: "Name of the API",
    handlers: [list_apis, create_api, get_api, replace_api, patch_api, delete_api],
}

collection! {
    Upstream,
    router: upstreams,
    tag: "upstreams",
    collection: "/v1/upstreams",
    item: "/v1/upstreams/{name}",
    name: "Name of the upstream",
    handlers: [list_upstreams, create_upstream, get_upstream, replace_upstream, patch_upstream, delete_upstream],
}

collection! {
    Consumer,
    router: consumers,
    tag: "consumers",
    collection: "/v1/consumers",
    item: "/v1/consumers/{name}",
    name: "The consumer's username",
    handlers: [list_consumers, create_consumer, get_consumer, replace_consumer, patch_consumer, delete_consumer],
}

collection! {
    Spec,
    router: specs,
    tag: "specs",
    collection: "/v1/specs",
    item: "/v1/specs/{name}",
    name: "Name of the spec",
    handlers: [list_specs, create_spec, get_spec, replace_spec, patch_spec, delete_spec],
}

collection! {
    Certificate,
    router: certificates,
    tag: "certificates",
    collection: "/v1/certificates",
    item: "/v1/certificates/{name}",
    name: "Name of the certificate",
    handlers: [
        list_certificates,
        create_certificate,
        get_certificate,
        replace_certificate,
        patch_certificate,
        delete_certificate
    ],
}

/// Every collection's routes.
pub fn routes() -> OpenApiRouter<Shared> {
    OpenApiRouter::new().merge(apis()).merge(upstreams()).merge(consumers()).merge(specs()).merge(certificates())
}
