// Copyright 2026 Cloudflare, Inc.
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
// http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

use crate::*;
use bytes::Bytes;
use http::header;

#[derive(Debug, Clone)]
pub struct CaseHeaderName(Bytes);

impl CaseHeaderName {
    pub fn new(name: String) -> Self {
        CaseHeaderName(name.into())
    }
}

impl CaseHeaderName {
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }

    pub fn from_slice(buf: &[u8]) -> Self {
        CaseHeaderName(Bytes::copy_from_slice(buf))
    }
}

/// A trait that converts into case-sensitive header names.
pub trait IntoCaseHeaderName {
    fn into_case_header_name(self) -> CaseHeaderName;

    /// portcullis patch (vendor/README.md): the wire spelling and the parsed name.
    /// By default the name is parsed from the spelling (for a name outside the
    /// standard set, a copy); [`StaticHeaderName`] has both already.
    fn into_case_and_name(self) -> Result<(CaseHeaderName, HeaderName)>
    where
        Self: Sized,
    {
        let case = self.into_case_header_name();
        let name = HeaderName::try_from(case.as_slice())
            .or_err(InvalidHTTPHeader, "invalid header name")?;
        Ok((case, name))
    }
}

/// portcullis patch (vendor/README.md): a header name known at compile time,
/// spelled on the wire as given (lower case). Inserting under it neither parses
/// nor copies the name: both the case map's spelling and the `HeaderName` point
/// at the static string.
#[derive(Debug, Clone)]
pub struct StaticHeaderName {
    wire: &'static str,
    name: HeaderName,
}

impl StaticHeaderName {
    /// Panics (at compile time in a `const`) unless `wire` is a valid lower-case name.
    pub const fn new(wire: &'static str) -> Self {
        StaticHeaderName {
            wire,
            name: HeaderName::from_static(wire),
        }
    }

    pub fn name(&self) -> &HeaderName {
        &self.name
    }
}

impl IntoCaseHeaderName for &StaticHeaderName {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(Bytes::from_static(self.wire.as_bytes()))
    }

    fn into_case_and_name(self) -> Result<(CaseHeaderName, HeaderName)> {
        Ok((
            CaseHeaderName(Bytes::from_static(self.wire.as_bytes())),
            self.name.clone(),
        ))
    }
}

impl IntoCaseHeaderName for CaseHeaderName {
    fn into_case_header_name(self) -> CaseHeaderName {
        self
    }
}

impl IntoCaseHeaderName for String {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(self.into())
    }
}

impl IntoCaseHeaderName for &'static str {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(self.into())
    }
}

impl IntoCaseHeaderName for HeaderName {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(titled_header_name(&self))
    }
}

impl IntoCaseHeaderName for &HeaderName {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(titled_header_name(self))
    }
}

impl IntoCaseHeaderName for Bytes {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(self)
    }
}

fn titled_header_name(header_name: &HeaderName) -> Bytes {
    titled_header_name_str(header_name).map_or_else(
        || Bytes::copy_from_slice(header_name.as_str().as_bytes()),
        |s| Bytes::from_static(s.as_bytes()),
    )
}

pub(crate) fn titled_header_name_str(header_name: &HeaderName) -> Option<&'static str> {
    Some(match *header_name {
        header::ACCEPT_RANGES => "Accept-Ranges",
        header::AGE => "Age",
        header::CACHE_CONTROL => "Cache-Control",
        header::CONNECTION => "Connection",
        header::CONTENT_TYPE => "Content-Type",
        header::CONTENT_ENCODING => "Content-Encoding",
        header::CONTENT_LENGTH => "Content-Length",
        header::DATE => "Date",
        header::TRANSFER_ENCODING => "Transfer-Encoding",
        header::HOST => "Host",
        header::SERVER => "Server",
        header::SET_COOKIE => "Set-Cookie",
        // TODO: add more const header here to map to their titled case
        // TODO: automatically upper case the first letter?
        _ => {
            return None;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_case_header_name() {
        assert_eq!("FoO".into_case_header_name().as_slice(), b"FoO");
        assert_eq!("FoO".to_string().into_case_header_name().as_slice(), b"FoO");
        assert_eq!(header::SERVER.into_case_header_name().as_slice(), b"Server");
    }
}
